package atomicfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"rolter.dev/pkg/atomicfile"
)

// Write creates the directory, replaces the contents whole, leaves no
// temporary file behind and keeps the file private.
func TestWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "f")
	for _, data := range []string{"first, longer contents", "second"} {
		if err := atomicfile.Write(path, []byte(data)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != data {
			t.Fatalf("read %q, %v; want %q", got, err, data)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("%d files in the directory, want the one written", len(entries))
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	if err := atomicfile.Write(filepath.Join(path, "under-a-file"), nil); err == nil {
		t.Fatal("writing under a regular file succeeded")
	}
}
