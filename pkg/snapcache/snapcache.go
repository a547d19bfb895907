// Package snapcache is the on-disk cache of the last control-plane snapshot
// a node applied (the proxies' and the kvwatchers' --snapshot-cache): a node
// restarted while no control plane answers starts from it instead of from
// nothing. The file is JSON, written atomically (temporary file, fsync,
// rename) with mode 0600, since a proxy's snapshot carries secrets.
package snapcache

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"rolter.dev/pkg/atomicfile"
)

// Entry is one cached snapshot: the WatchResponse fields a node needs to
// apply it again.
type Entry struct {
	VersionInfo    string    `json:"version_info"`
	Revision       int64     `json:"revision"`
	ClusterID      uint64    `json:"cluster_id"`
	ContentHash    string    `json:"content_hash"`
	PepperCheck    string    `json:"pepper_check"`
	ControlPlaneID string    `json:"controlplane_id"`
	ConfigTOML     string    `json:"config_toml"`
	SavedAt        time.Time `json:"saved_at"`
}

// Load reads the cache at path. A missing file is (nil, nil): a first
// start, not an error.
func Load(path string) (*Entry, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot cache: %w", err)
	}
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("snapshot cache %s: %w", path, err)
	}
	return &e, nil
}

// Save writes e to path atomically, stamping SavedAt with the current time.
func Save(path string, e Entry) error {
	e.SavedAt = time.Now().UTC()
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b)
}
