package controlplane_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// TestKeys: a key's secret is returned once, authenticates through every
// proxy, and is never stored in etcd nor returned by get or list; a
// disabled key is refused everywhere within a second; a rotated key's old
// secret stops working and the new one works.
func TestKeys(t *testing.T) {
	etcd := startEtcd(t)
	cp1 := startControlPlane(t, etcd, "cp1")
	cp2 := startControlPlane(t, etcd, "cp2")
	dir := t.TempDir()
	p1 := startProxy(t, filepath.Join(dir, "p1.json"), pepper, cp1)
	p2 := startProxy(t, filepath.Join(dir, "p2.json"), pepper, cp2)
	proxies := []*proxy{p1, p2}
	ua, ub := upstream(t, "a"), upstream(t, "b")
	admin := cp1.admin(t)
	// No require_auth in the document: true, so a config that never had a
	// key is closed.
	closed := strings.Replace(routeTo(ua, ub, "m1", "a"), openAuth, "", 1)
	if _, err := admin.Apply(ctx(t), &pb.ApplyRequest{ConfigToml: closed}); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		eventually(t, converge, "auth required", serves(p, "m1", "", "401"))
	}

	created, err := admin.CreateKey(ctx(t), &pb.CreateKeyRequest{Key: &pb.VirtualKey{Name: "team-a", Models: []string{"m1"}}})
	if err != nil {
		t.Fatal(err)
	}
	secret := created.GetSecret()
	if !strings.HasPrefix(secret, "sk-rolter-") || len(secret) < 40 {
		t.Fatalf("secret %q", secret)
	}
	for _, p := range proxies {
		eventually(t, converge, "new key authenticates", serves(p, "m1", secret, "a"))
		if err := serves(p, "m1", "sk-rolter-not-a-real-key-0000000000000", "401")(); err != nil {
			t.Error(err)
		}
	}

	// The secret is nowhere but in the create response.
	assertNoSecret := func(secret string) {
		t.Helper()
		resp, err := etcd.client(t).Get(ctx(t), "", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if strings.Contains(string(kv.Value), secret) || strings.Contains(string(kv.Key), secret) {
				t.Errorf("etcd key %s holds the secret", kv.Key)
			}
		}
		list, err := cp2.admin(t).ListKeys(ctx(t), &pb.ListKeysRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := cp2.admin(t).GetKey(ctx(t), &pb.GetKeyRequest{Name: "team-a"})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := cp2.admin(t).GetConfig(ctx(t), &pb.GetConfigRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{fmt.Sprint(list), fmt.Sprint(got), cfg.GetConfigToml()} {
			if strings.Contains(s, secret) {
				t.Errorf("an admin response holds the secret: %s", s)
			}
		}
		if len(list.GetKeys()) != 1 || list.GetKeys()[0].GetSecretSource() != "digest" || len(list.GetKeys()[0].GetDigestPrefix()) != 12 {
			t.Errorf("list: %v", list)
		}
	}
	assertNoSecret(secret)

	if _, err := cp2.admin(t).DisableKey(ctx(t), &pb.DisableKeyRequest{Name: "team-a"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		eventually(t, converge, "disabled key refused", serves(p, "m1", secret, "401"))
	}
	if _, err := admin.EnableKey(ctx(t), &pb.EnableKeyRequest{Name: "team-a"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		eventually(t, converge, "enabled again", serves(p, "m1", secret, "a"))
	}

	rotated, err := admin.RotateKey(ctx(t), &pb.RotateKeyRequest{Name: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		eventually(t, converge, "rotated key works", serves(p, "m1", rotated.GetSecret(), "a"))
		eventually(t, converge, "old secret refused", serves(p, "m1", secret, "401"))
	}
	assertNoSecret(rotated.GetSecret())

	// A key restricted to m1 may not call another route.
	if _, err := admin.Apply(ctx(t), &pb.ApplyRequest{ConfigToml: closed +
		"[[routes]]\nmodel = \"m2\"\ntargets = [{ provider = \"b\" }]\n"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		eventually(t, converge, "m2 exists", serves(p, "m2", rotated.GetSecret(), "403"))
	}
	// The apply kept the key it did not mention; prune_keys removes it.
	if _, err := admin.Apply(ctx(t), &pb.ApplyRequest{PruneKeys: true, ConfigToml: closed}); err != nil {
		t.Fatal(err)
	}
	// Removing the last key leaves the gateway closed, to the revoked key
	// and to requests without one.
	for _, p := range proxies {
		eventually(t, converge, "pruned key refused", serves(p, "m1", rotated.GetSecret(), "401"))
		eventually(t, converge, "no key refused", serves(p, "m1", "", "401"))
	}
}

// TestNackKeepsOldConfig: a proxy whose key pepper differs from the
// control plane's refuses a snapshot with keys (they could never
// authenticate), keeps serving the previous one, and the control plane
// reports the NACK and its reason.
func TestNackKeepsOldConfig(t *testing.T) {
	etcd := startEtcd(t)
	cp := startControlPlane(t, etcd, "cp")
	p := startProxy(t, filepath.Join(t.TempDir(), "p.json"), "another-pepper-0123456789", cp)
	ua, ub := upstream(t, "a"), upstream(t, "b")
	admin := cp.admin(t)
	if _, err := admin.Apply(ctx(t), &pb.ApplyRequest{ConfigToml: routeTo(ua, ub, "m1", "a")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, converge, "served", serves(p, "m1", "", "a"))
	good, err := admin.GetConfig(ctx(t), &pb.GetConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateKey(ctx(t), &pb.CreateKeyRequest{Key: &pb.VirtualKey{Name: "k"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*converge, "status shows the NACK", func() error {
		st, err := admin.Status(ctx(t), &pb.StatusRequest{})
		if err != nil {
			return err
		}
		if len(st.GetNodes()) != 1 {
			return fmt.Errorf("nodes: %v", st.GetNodes())
		}
		n := st.GetNodes()[0]
		if n.GetState() != pb.NodeState_NODE_STATE_NACKED || !strings.Contains(n.GetErrorDetail(), "key pepper differs") ||
			n.GetAckedVersion() != fmt.Sprint(good.GetRevision()) {
			return fmt.Errorf("node: %v", n)
		}
		return nil
	})
	// Still the old config: open (no keys), route m1.
	if err := serves(p, "m1", "", "a")(); err != nil {
		t.Fatal(err)
	}
}

// TestKVWatcherGetsNoSecrets: a kvwatcher's snapshot holds the providers
// but no virtual key (not even a digest) and no inline provider API key.
func TestKVWatcherGetsNoSecrets(t *testing.T) {
	etcd := startEtcd(t)
	cp := startControlPlane(t, etcd, "cp")
	ua, ub := upstream(t, "a"), upstream(t, "b")
	doc := routeTo(ua, ub, "m1", "a") + `
[[providers]]
name = "hosted"
kind = "openai"
api_base = "https://api.openai.com"
api_key = "sk-inline-provider-secret"

[[virtual_keys]]
name = "k"
key = "sk-rolter-inline-virtual-key-0000"
`
	if _, err := cp.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: doc}); err != nil {
		t.Fatal(err)
	}
	for _, role := range []pb.NodeRole{pb.NodeRole_NODE_ROLE_KVWATCHER, pb.NodeRole_NODE_ROLE_DATAPLANE} {
		stream, err := pbSnapshot(t, cp.addr, nodeToken).Watch(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&pb.WatchRequest{Node: &pb.NodeInfo{Id: "w-" + role.String(), Role: role}}); err != nil {
			t.Fatal(err)
		}
		// The replica's watch may not have caught up with the apply when the
		// stream opens: take snapshots until the applied one arrives.
		var cfg string
		for range 20 {
			snap, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if cfg = snap.GetConfigToml(); strings.Contains(cfg, `name = 'hosted'`) {
				break
			}
			if err := stream.Send(&pb.WatchRequest{VersionInfo: snap.GetVersionInfo(), ResponseNonce: snap.GetNonce()}); err != nil {
				t.Fatal(err)
			}
		}
		if !strings.Contains(cfg, `name = 'hosted'`) || strings.Contains(cfg, "sk-rolter-inline-virtual-key") {
			t.Errorf("%s snapshot:\n%s", role, cfg)
		}
		hasKeys, hasInline := strings.Contains(cfg, "key_digest"), strings.Contains(cfg, "sk-inline-provider-secret")
		if want := role == pb.NodeRole_NODE_ROLE_DATAPLANE; hasKeys != want || hasInline != want {
			t.Errorf("%s snapshot: key digests %v, inline provider key %v", role, hasKeys, hasInline)
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
	}
}
