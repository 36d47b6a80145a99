package provenance

import (
	"fmt"
	"io"
)

// Keygen writes a new key pair into dir, as WriteKeyPair does, and tells w where each half
// goes. It is the whole of `worker keygen` and `submit keygen`, so the two never drift.
func Keygen(dir string, w io.Writer) (KeyPair, error) {
	kp, err := WriteKeyPair(dir)
	if err != nil {
		return KeyPair{}, err
	}
	_, err = fmt.Fprintf(w, "private key: %s (give it to workers: --signing-key or signing_key)\npublic key:  %s (verify with: submit verify JOB_ID --public-key %s)\nkey id:      %s\n",
		kp.PrivatePath, kp.PublicPath, kp.PublicPath, kp.KeyID)
	return kp, err
}
