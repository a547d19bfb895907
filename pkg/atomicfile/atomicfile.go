// Package atomicfile writes a file so that a reader, or a process
// restarted after a crash, finds either the old contents or the new, never
// a mix: the data goes to a temporary file in the same directory, is
// synced, and is renamed over the target. Files are private to the user
// (0600, their directory 0700 when created): the nodes' snapshot caches
// carry secrets, and a proxy's routing state the hashes of its prompts.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path's contents with data atomically.
func Write(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
