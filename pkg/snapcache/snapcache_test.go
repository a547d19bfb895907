package snapcache_test

import (
	"os"
	"path/filepath"
	"testing"

	"rolter.dev/pkg/snapcache"
)

func TestSaveLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "snap.json")
	if e, err := snapcache.Load(path); e != nil || err != nil {
		t.Fatalf("missing file: %v, %v; want nil, nil", e, err)
	}
	in := snapcache.Entry{VersionInfo: "v7", Revision: 7, ClusterID: 3, ContentHash: "h", PepperCheck: "p", ControlPlaneID: "cp", ConfigTOML: "x = 1\n"}
	if err := snapcache.Save(path, in); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("stat %v, %v; want mode 0600", st, err)
	}
	out, err := snapcache.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if out.SavedAt.IsZero() {
		t.Error("SavedAt not stamped")
	}
	out.SavedAt = in.SavedAt
	if *out != in {
		t.Fatalf("loaded %+v, want %+v", *out, in)
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := snapcache.Load(path); err == nil {
		t.Fatal("corrupt cache loaded without an error")
	}
}

// FuzzLoad: any file content either loads or errors, never panics.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`{"version_info":"v1","config_toml":"a = 1"}`))
	f.Add([]byte(`{`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "c.json")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _ = snapcache.Load(path)
	})
}
