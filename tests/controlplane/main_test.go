package controlplane_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a control plane, proxy, relay or etcd
// leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
