package workercmd

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// writeReadyFile writes addrs as JSON to path atomically: a reader sees no file or the whole
// file, never a part (a temporary file in the same folder, synced, then renamed over path).
func writeReadyFile(path string, addrs Addrs) error {
	data, err := json.Marshal(addrs)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("ready file: %w", err)
	}
	_, err = f.Write(append(data, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("ready file: %w", err)
	}
	return nil
}
