package controlplane_test

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rolter.dev/pkg/routing"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

func canaryDoc(stable, canary string, ws, wc int) string {
	return fmt.Sprintf(`
[[providers]]
name = "stable"
kind = "openai_compatible"
api_base = %q

[[providers]]
name = "canary"
kind = "openai_compatible"
api_base = %q

[server]
require_auth = false
[accounting]
sink = "none"

[[routes]]
model = "m"

[[routes.variants]]
name = "stable"
weight = %d
targets = [{ provider = "stable" }]

[[routes.variants]]
name = "canary"
weight = %d
targets = [{ provider = "canary" }]
`, stable, canary, ws, wc)
}

// variantReply is one answer of the load: which session asked, which
// variant the proxy named and which upstream answered.
type variantReply struct {
	session, variant, from string
	status                 int
	done                   time.Time
}

// TestCanaryWeightChangeUnderLoad: a proxy follows a control plane; a
// canary's weight goes from 10 to 50 with the admin API's Apply (what
// `rolterctl apply -f` sends) while requests flow. No request fails; every
// answer comes from the variant its session is assigned under the old or
// the new weights, and from a second after the apply on every answer
// follows the new ones.
func TestCanaryWeightChangeUnderLoad(t *testing.T) {
	etcd := startEtcd(t)
	cp := startControlPlane(t, etcd, "cp1")
	p := startProxy(t, filepath.Join(t.TempDir(), "p.json"), pepper, cp)
	us, uc := upstream(t, "stable"), upstream(t, "canary")
	names := []string{"stable", "canary"}
	assigned := func(session string, weights []int) string {
		return names[routing.RankVariants(nil, routing.AssignmentKey(session, "", ""), names, weights)[0]]
	}

	if _, err := cp.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: canaryDoc(us, uc, 90, 10)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*converge, "route m served", serves(p, "m", "", "stable"))

	const sessions = 500
	var (
		mu      sync.Mutex
		replies []variantReply
		stop    atomic.Bool
		wg      sync.WaitGroup
	)
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; !stop.Load(); i += 4 {
				session := fmt.Sprintf("user-%d", i%sessions)
				req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/chat/completions",
					strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Session-Id", session)
				rep := variantReply{session: session}
				resp, err := client.Do(req)
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					rep.status, rep.variant, rep.from = resp.StatusCode, resp.Header.Get("X-Rolter-Variant"), string(b)
				} else {
					rep.from = err.Error()
				}
				rep.done = time.Now()
				mu.Lock()
				replies = append(replies, rep)
				mu.Unlock()
			}
		}()
	}
	count := func(since time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range replies {
			if r.done.After(since) {
				n++
			}
		}
		return n
	}
	eventually(t, 30*time.Second, "load running", func() error {
		if n := count(time.Time{}); n < 100 {
			return fmt.Errorf("%d replies", n)
		}
		return nil
	})

	if _, err := cp.admin(t).Apply(ctx(t), &pb.ApplyRequest{ConfigToml: canaryDoc(us, uc, 50, 50)}); err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	// Enough answers after the apply to see where the sessions go (the rate
	// depends on the machine, so the wait is on a count, not a time).
	eventually(t, 30*time.Second, "answers after the apply", func() error {
		mu.Lock()
		last := time.Time{}
		if len(replies) > 0 {
			last = replies[len(replies)-1].done
		}
		mu.Unlock()
		if n := count(applied); n < 200 || last.Sub(applied) < 2*converge {
			return fmt.Errorf("%d answers over %v since the apply", n, last.Sub(applied))
		}
		return nil
	})
	stop.Store(true)
	wg.Wait()

	// The split followed: the last answer still on the old weights (for a
	// session the change moved) came within a second of the apply.
	var lag time.Duration
	for _, r := range replies {
		if r.done.After(applied) && r.variant != assigned(r.session, []int{50, 50}) {
			lag = max(lag, r.done.Sub(applied))
		}
	}
	if lag > converge {
		t.Errorf("answers followed the old weights until %v after the apply", lag)
	}
	moved, canary, after := 0, 0, 0
	for _, r := range replies {
		if r.status != http.StatusOK {
			t.Fatalf("a request failed during the change: %d %s", r.status, r.from)
		}
		old, cur := assigned(r.session, []int{90, 10}), assigned(r.session, []int{50, 50})
		if r.variant != old && r.variant != cur {
			t.Fatalf("session %s answered by %s, assigned %s before and %s after", r.session, r.variant, old, cur)
		}
		if !strings.Contains(r.from, "from "+r.variant) {
			t.Fatalf("x-rolter-variant %s but the answer is %s", r.variant, r.from)
		}
		if r.done.After(applied) {
			after++
			if r.variant == "canary" {
				canary++
			}
		}
	}
	for i := range sessions {
		s := fmt.Sprintf("user-%d", i)
		if assigned(s, []int{90, 10}) != assigned(s, []int{50, 50}) {
			moved++
		}
	}
	t.Logf("%d requests, %d after the apply (%.2f canary); %d of %d sessions moved; old weights seen until %v after the apply",
		len(replies), after, float64(canary)/float64(max(after, 1)), moved, sessions, lag)
}
