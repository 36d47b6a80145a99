package submitcmd

import (
	"errors"
	"flag"
	"fmt"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

// keygen writes a new manifest signing key pair: the private half for the workers (--signing-key,
// or a Secret in a cluster), the public half for whoever runs verify.
func (e *env) keygen(args []string) error {
	fs := flag.NewFlagSet("submit keygen", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	out := fs.String("out", "", "folder to write signing.key (mode 0600) and signing.pub into (required; created 0700 if missing)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("keygen: unexpected argument %q", fs.Arg(0))
	}
	if *out == "" {
		return errors.New("keygen: --out DIR is required")
	}
	kp, err := provenance.WriteKeyPair(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "private key: %s (give it to workers: --signing-key or signing_key)\npublic key:  %s (verify with: submit verify JOB_ID --public-key %s)\nkey id:      %s\n",
		kp.PrivatePath, kp.PublicPath, kp.PublicPath, kp.KeyID)
	return nil
}
