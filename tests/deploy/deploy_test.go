// Package deploy_test checks deploy/ (Dockerfiles, docker-compose files,
// HAProxy config, Kubernetes manifests, the rolter.toml files) against the
// code: every flag given to a rolter binary is one the binary defines (read
// from its -h output), every ROLTER_/OTEL_ environment variable is one the
// binary's own packages spell, every port matches a --listen-style flag,
// every probe path is served by the binary on that port, and every address
// points at a service that listens there.
package deploy_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"rolter.dev/pkg/config"
)

var repo = filepath.Join("..", "..")

// binary describes one rolter executable and its image.
type binary struct {
	name, module, pkg string
	// served maps an HTTP path to the flag whose address serves it.
	served map[string]string
	// grpc is the flag of the address serving gRPC health, if any.
	grpc string
	// portFlags are flags whose value holds an address the binary binds.
	portFlags []string
}

var binaries = map[string]*binary{
	"rolter-proxy": {name: "rolter-proxy", module: "dataplane", pkg: "./cmd/rolter-proxy",
		served:    map[string]string{"/healthz": "listen", "/readyz": "listen", "/metrics": "listen"},
		portFlags: []string{"listen"}},
	"rolter-controlplane": {name: "rolter-controlplane", module: "controlplane", pkg: "./cmd/rolter-controlplane",
		served: map[string]string{"/metrics": "metrics-listen"}, grpc: "listen",
		portFlags: []string{"listen", "metrics-listen", "embed-etcd-listen"}},
	"rolterctl": {name: "rolterctl", module: "controlplane", pkg: "./cmd/rolterctl"},
	"rolter-kvwatcher": {name: "rolter-kvwatcher", module: "kvwatcher", pkg: "./cmd/rolter-kvwatcher",
		served:    map[string]string{"/healthz": "metrics-listen", "/readyz": "metrics-listen", "/metrics": "metrics-listen"},
		portFlags: []string{"metrics-listen", "embed-nats"}},
	"vllmsim": {name: "vllmsim", module: "tests", pkg: "./cmd/vllmsim",
		served:    map[string]string{"/health": "listen", "/metrics": "listen"},
		portFlags: []string{"listen", "kv-events", "kv-replay"}},
}

// Ports of the third-party images the files use.
var thirdParty = map[string][]int{"etcd": {2379, 2380}, "nats": {4222, 8222}, "redis": {6379}, "haproxy": {8080, 8404}, "vllm-openai": {8000, 5557, 5558}}

// binInfo is what the built binary and its packages tell about it.
type binInfo struct {
	flags   map[string]bool // name -> takes a value
	sub     map[string]map[string]bool
	env     map[string]bool // ROLTER_*/OTEL_* names spelled in its packages
	literal map[string]bool // HTTP paths spelled as string literals in its packages
}

var (
	binDir   string
	infoOnce sync.Once
	infos    map[string]*binInfo
	infoErr  error
)

var (
	usageRe   = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][-A-Za-z0-9_.]*)(?: (\S+))?`)
	envRe     = regexp.MustCompile(`"((?:ROLTER|OTEL)_[A-Z0-9_]+)"`)
	pathRe    = regexp.MustCompile(`"(/[a-z]+)"`)
	subRe     = regexp.MustCompile(`(?s)sub\("([a-z ]+)", args(?:\[1:\])?, func\(fs \*flag\.FlagSet\) \{(.*?)\}\)`)
	subFlagRe = regexp.MustCompile(`fs\.(\w+)Var\(&\w+, "([^"]+)"`)
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func loadInfos() (map[string]*binInfo, error) {
	infoOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rolter-deploy-test")
		binDir = dir
		if err != nil {
			infoErr = err
			return
		}
		infos = map[string]*binInfo{}
		for name, b := range binaries {
			out := filepath.Join(dir, name)
			cmd := exec.Command("go", "build", "-o", out, b.pkg)
			cmd.Dir = filepath.Join(repo, b.module)
			if msg, err := cmd.CombinedOutput(); err != nil {
				infoErr = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, msg)
				return
			}
			usage, _ := exec.Command(out, "-h").CombinedOutput()
			bi := &binInfo{flags: map[string]bool{}, env: map[string]bool{}, literal: map[string]bool{}, sub: map[string]map[string]bool{}}
			for _, m := range usageRe.FindAllStringSubmatch(string(usage), -1) {
				bi.flags[m[1]] = m[2] != ""
			}
			if len(bi.flags) == 0 {
				infoErr = fmt.Errorf("%s -h printed no flags:\n%s", name, usage)
				return
			}
			// The sources of the binary's own packages.
			cmd = exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}|{{.Dir}}|{{join .GoFiles ","}}`, b.pkg)
			cmd.Dir = filepath.Join(repo, b.module)
			list, err := cmd.Output()
			if err != nil {
				infoErr = fmt.Errorf("go list %s: %v", b.pkg, err)
				return
			}
			for _, line := range strings.Split(strings.TrimSpace(string(list)), "\n") {
				parts := strings.Split(line, "|")
				if !strings.HasPrefix(parts[0], "rolter.dev/") || parts[2] == "" {
					continue
				}
				for _, f := range strings.Split(parts[2], ",") {
					src, err := os.ReadFile(filepath.Join(parts[1], f))
					if err != nil {
						infoErr = err
						return
					}
					for _, m := range envRe.FindAllStringSubmatch(string(src), -1) {
						bi.env[m[1]] = true
					}
					for _, m := range pathRe.FindAllStringSubmatch(string(src), -1) {
						bi.literal[m[1]] = true
					}
					if name == "rolterctl" {
						for _, m := range subRe.FindAllStringSubmatch(string(src), -1) {
							fl := map[string]bool{}
							for _, fm := range subFlagRe.FindAllStringSubmatch(m[2], -1) {
								fl[fm[2]] = fm[1] != "Bool"
							}
							if len(fl) > 0 {
								bi.sub[m[1]] = fl
							}
						}
					}
				}
			}
			infos[name] = bi
		}
	})
	return infos, infoErr
}

// parseArgs checks args against the flag set (Go flag syntax) and returns the
// flag values and the positional arguments.
func parseArgs(flags map[string]bool, args []string) (map[string]string, []string, error) {
	vals := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return vals, args[i+1:], nil
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			return vals, args[i:], nil
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takes, ok := flags[name]
		if !ok {
			return nil, nil, fmt.Errorf("unknown flag %q", a)
		}
		if takes && !hasVal {
			if i+1 >= len(args) {
				return nil, nil, fmt.Errorf("flag %q needs a value", a)
			}
			i++
			val = args[i]
		}
		if !takes && hasVal && val != "true" && val != "false" {
			return nil, nil, fmt.Errorf("boolean flag %q given %q", a, val)
		}
		vals[name] = val
	}
	return vals, nil, nil
}

// container is one rolter process found in a compose file or manifest.
type container struct {
	where   string
	bin     *binary
	args    []string
	env     []string
	ports   []int          // container ports it is declared to expose
	named   map[string]int // k8s port names
	probes  []probe
	vals    map[string]string
	listens map[string]int // flag -> bound port
}

type probe struct {
	kind, path string
	port       any
}

// binaryOf maps an image reference to a rolter binary (nil for others).
func binaryOf(image string) *binary {
	name := image[strings.LastIndex(image, "/")+1:]
	name, _, _ = strings.Cut(name, ":")
	return binaries[name]
}

func portOf(addr string) (int, error) {
	if u, err := url.Parse(addr); err == nil && u.Scheme != "" && u.Host != "" {
		addr = u.Host
	}
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// checkContainer runs the checks common to compose and Kubernetes.
func checkContainer(t *testing.T, c *container) {
	t.Helper()
	infos, err := loadInfos()
	if err != nil {
		t.Fatal(err)
	}
	bi := infos[c.bin.name]
	vals, rest, err := parseArgs(bi.flags, c.args)
	if err != nil {
		t.Errorf("%s: %s: %v", c.where, c.bin.name, err)
		return
	}
	if c.bin.name == "rolterctl" {
		if len(rest) == 0 {
			t.Errorf("%s: rolterctl without a command", c.where)
		} else if fl, ok := bi.sub[rest[0]]; !ok {
			t.Errorf("%s: rolterctl has no command %q with flags", c.where, rest[0])
		} else if _, _, err := parseArgs(fl, rest[1:]); err != nil {
			t.Errorf("%s: rolterctl %s: %v", c.where, rest[0], err)
		}
	} else if len(rest) > 0 {
		t.Errorf("%s: %s takes no positional arguments, got %q", c.where, c.bin.name, rest)
	}
	c.vals = vals
	c.listens = map[string]int{}
	for _, f := range c.bin.portFlags {
		v, ok := vals[f]
		if !ok {
			continue
		}
		p, err := portOf(strings.Replace(v, "*", "0.0.0.0", 1))
		if err != nil {
			t.Errorf("%s: --%s=%q: %v", c.where, f, v, err)
			continue
		}
		c.listens[f] = p
		host, _, _ := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(v, "tcp://"), "http://"))
		if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
			t.Errorf("%s: --%s=%q binds loopback, unreachable from outside the container", c.where, f, v)
		}
	}
	for _, f := range []string{"metrics-listen"} {
		if _, ok := bi.flags[f]; ok && slices.Contains(c.bin.portFlags, f) && c.vals[f] == "" && len(c.bin.served) > 0 {
			t.Errorf("%s: %s needs an explicit --%s (its default is loopback or off)", c.where, c.bin.name, f)
		}
	}
	listening := map[int]bool{}
	for _, p := range c.listens {
		listening[p] = true
	}
	for _, p := range c.ports {
		if !listening[p] {
			t.Errorf("%s: port %d is exposed but no --listen-style flag binds it (%v)", c.where, p, c.listens)
		}
	}
	for _, e := range c.env {
		if (strings.HasPrefix(e, "ROLTER_") || strings.HasPrefix(e, "OTEL_")) && !bi.env[e] {
			t.Errorf("%s: %s never reads the environment variable %s", c.where, c.bin.name, e)
		}
	}
	for _, pr := range c.probes {
		port, ok := 0, false
		switch v := pr.port.(type) {
		case int:
			port, ok = v, true
		case string:
			port, ok = c.named[v]
		}
		if !ok {
			t.Errorf("%s: probe port %v is not a declared container port", c.where, pr.port)
			continue
		}
		switch pr.kind {
		case "httpGet":
			flag, served := c.bin.served[pr.path]
			if !served || !bi.literal[pr.path] {
				t.Errorf("%s: %s serves no %s", c.where, c.bin.name, pr.path)
			} else if c.listens[flag] != port {
				t.Errorf("%s: probe %s on port %d, but %s serves it on --%s (port %d)", c.where, pr.path, port, c.bin.name, flag, c.listens[flag])
			}
		case "grpc":
			if c.bin.grpc == "" || c.listens[c.bin.grpc] != port {
				t.Errorf("%s: gRPC probe on port %d, which is not %s's gRPC address", c.where, port, c.bin.name)
			}
		case "tcpSocket":
			if !listening[port] {
				t.Errorf("%s: TCP probe on port %d, which nothing binds", c.where, port)
			}
		}
	}
}

// yamlDocs decodes every document of a (multi-document) YAML file.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Compose's !reset tag means "drop the inherited value".
	data = bytes.ReplaceAll(data, []byte("!reset "), nil)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for {
		var d map[string]any
		if err := dec.Decode(&d); err != nil {
			if err.Error() == "EOF" {
				return docs
			}
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
}

func strs(v any) []string {
	switch x := v.(type) {
	case []any:
		var out []string
		for _, e := range x {
			out = append(out, fmt.Sprint(e))
		}
		return out
	case string:
		return strings.Fields(x)
	}
	return nil
}

func m(v any) map[string]any { x, _ := v.(map[string]any); return x }
func l(v any) []any          { x, _ := v.([]any); return x }

func atoi(v any) int {
	switch x := v.(type) {
	case int:
		return x
	case string:
		n, _ := strconv.Atoi(x)
		return n
	}
	return 0
}

// ---------------------------------------------------------------- Dockerfiles

var dockerfiles = map[string]string{ // file -> binary
	"controlplane.Dockerfile": "rolter-controlplane",
	"dataplane.Dockerfile":    "rolter-proxy",
	"kvwatcher.Dockerfile":    "rolter-kvwatcher",
	"rolterctl.Dockerfile":    "rolterctl",
	"vllmsim.Dockerfile":      "vllmsim",
}

func TestDockerfiles(t *testing.T) {
	buildRe := regexp.MustCompile(`cd (\S+) && go build -trimpath -ldflags="-s -w" -o /out/(\S+) (\S+)`)
	for file, name := range dockerfiles {
		data, err := os.ReadFile(filepath.Join(repo, "deploy", "docker", file))
		if err != nil {
			t.Fatal(err)
		}
		src := string(data)
		b := binaries[name]
		mm := buildRe.FindStringSubmatch(src)
		if mm == nil || mm[1] != b.module || mm[2] != name || mm[3] != b.pkg {
			t.Errorf("%s: want `cd %s && go build ... -o /out/%s %s`, got %q", file, b.module, name, b.pkg, mm)
		}
		if _, err := os.Stat(filepath.Join(repo, b.module, b.pkg)); err != nil {
			t.Errorf("%s: %v", file, err)
		}
		for _, want := range []string{"FROM golang:1.26 AS build", "CGO_ENABLED=0", "COPY . .",
			"FROM gcr.io/distroless/static-debian12:nonroot", "USER nonroot:nonroot",
			fmt.Sprintf(`ENTRYPOINT ["/usr/local/bin/%s"]`, name), "COPY --from=build /out/" + name + " /usr/local/bin/" + name} {
			if !strings.Contains(src, want) {
				t.Errorf("%s: missing %q", file, want)
			}
		}
		// EXPOSE lists the ports the compose file has the binary bind.
		var exposed []int
		for _, line := range strings.Split(src, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == "EXPOSE" {
				for _, p := range f[1:] {
					exposed = append(exposed, atoi(p))
				}
			}
		}
		want := composePorts(t)[name]
		sort.Ints(exposed)
		if !slices.Equal(exposed, want) {
			t.Errorf("%s: EXPOSE %v, but the compose file binds %v", file, exposed, want)
		}
	}
}

// ---------------------------------------------------------------- compose

type composeFile struct {
	path     string
	services map[string]map[string]any
	volumes  map[string]bool // the named volumes it declares
}

func loadCompose(t *testing.T, name string) composeFile {
	docs := yamlDocs(t, filepath.Join(repo, "deploy", "compose", name))
	if len(docs) != 1 {
		t.Fatalf("%s: %d documents", name, len(docs))
	}
	cf := composeFile{path: name, services: map[string]map[string]any{}, volumes: map[string]bool{}}
	for k, v := range m(docs[0]["services"]) {
		cf.services[k] = m(v)
	}
	for k := range m(docs[0]["volumes"]) {
		cf.volumes[k] = true
	}
	return cf
}

// keptByCompose says whether path lies on one of service svc's named
// volumes, mounted writable: storage that outlives the container, which a
// tmpfs (emptied when the container stops) and the image's own layer (the
// containers run read-only) are not.
//
// A named volume first mounted at a directory starts with the image's
// contents and owner there, so the rolter image has to own that directory
// for its nonroot user (65532), or the node cannot write its files.
func keptByCompose(t *testing.T, cf composeFile, c *container, svc map[string]any) func(path string) bool {
	for _, v := range l(svc["volumes"]) {
		parts := strings.Split(fmt.Sprint(v), ":")
		if len(parts) < 2 || !cf.volumes[parts[0]] {
			continue
		}
		file := ""
		for f, name := range dockerfiles {
			if name == c.bin.name {
				file = f
			}
		}
		data, err := os.ReadFile(filepath.Join(repo, "deploy", "docker", file))
		if err != nil {
			t.Errorf("%s: the Dockerfile of %s: %v", c.where, c.bin.name, err)
			continue
		}
		if !regexp.MustCompile(`(?m)^COPY --from=build --chown=65532:65532 \S+ ` + regexp.QuoteMeta(parts[1]) + `$`).Match(data) {
			t.Errorf("%s: volume %s is mounted at %s, which %s does not create owned by the nonroot user (COPY --chown=65532:65532)", c.where, parts[0], parts[1], file)
		}
	}
	return func(path string) bool {
		for _, v := range l(svc["volumes"]) {
			parts := strings.Split(fmt.Sprint(v), ":")
			if len(parts) >= 2 && cf.volumes[parts[0]] && strings.HasPrefix(path, parts[1]+"/") &&
				(len(parts) < 3 || !strings.Contains(parts[2], "ro")) {
				return true
			}
		}
		return false
	}
}

// composeContainers returns the rolter processes of a compose file.
func composeContainers(t *testing.T, cf composeFile) map[string]*container {
	out := map[string]*container{}
	for name, svc := range cf.services {
		b := binaryOf(fmt.Sprint(svc["image"]))
		if b == nil {
			continue
		}
		c := &container{where: cf.path + ": " + name, bin: b, args: strs(svc["command"])}
		if ep := strs(svc["entrypoint"]); len(ep) > 0 {
			t.Errorf("%s: do not override the entrypoint of a rolter image", c.where)
		}
		for k := range m(svc["environment"]) {
			c.env = append(c.env, k)
		}
		for _, e := range l(svc["environment"]) { // list form
			k, _, _ := strings.Cut(fmt.Sprint(e), "=")
			c.env = append(c.env, k)
		}
		for _, p := range l(svc["expose"]) {
			c.ports = append(c.ports, atoi(p))
		}
		for _, p := range l(svc["ports"]) {
			parts := strings.Split(fmt.Sprint(p), ":")
			c.ports = append(c.ports, atoi(parts[len(parts)-1]))
		}
		if bd := m(svc["build"]); bd != nil {
			df := fmt.Sprint(bd["dockerfile"])
			if dockerfiles[filepath.Base(df)] != b.name {
				t.Errorf("%s: image %s built from %s", c.where, b.name, df)
			}
		}
		checkContainer(t, c)
		out[name] = c
	}
	return out
}

// composePorts returns, per rolter binary, the ports the compose file binds.
func composePorts(t *testing.T) map[string][]int {
	out := map[string][]int{}
	for _, c := range composeContainers(t, loadCompose(t, "docker-compose.yml")) {
		for _, p := range c.listens {
			if !slices.Contains(out[c.bin.name], p) {
				out[c.bin.name] = append(out[c.bin.name], p)
			}
		}
	}
	for k := range out {
		sort.Ints(out[k])
	}
	return out
}

// servicePorts returns the ports a compose service listens on.
func servicePorts(cf composeFile, cs map[string]*container, host string) []int {
	if c, ok := cs[host]; ok {
		var ps []int
		for _, p := range c.listens {
			ps = append(ps, p)
		}
		return ps
	}
	svc, ok := cf.services[host]
	if !ok {
		return nil
	}
	img := fmt.Sprint(svc["image"])
	img = img[strings.LastIndex(img, "/")+1:]
	img, _, _ = strings.Cut(img, ":")
	return thirdParty[img]
}

// checkAddr checks that addr (host:port or URL) names a service listening there.
func checkAddr(t *testing.T, where, addr string, ports func(host string) []int) {
	t.Helper()
	if u, err := url.Parse(addr); err == nil && u.Scheme != "" && u.Host != "" {
		addr = u.Host
	}
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: address %q: %v", where, addr, err)
		return
	}
	port, _ := strconv.Atoi(p)
	ps := ports(host)
	if ps == nil {
		t.Errorf("%s: address %q: no service %q", where, addr, host)
	} else if !slices.Contains(ps, port) {
		t.Errorf("%s: address %q: %s listens on %v, not %d", where, addr, host, ps, port)
	}
}

// checkConfig loads a rolter.toml with the proxy's own decoder and checks its
// addresses.
func checkConfig(t *testing.T, path string, ports func(host string) []int) {
	t.Helper()
	cfg, _, err := config.Load(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if !cfg.Cache.Enabled || cfg.Cache.RedisURL == "" {
		t.Errorf("%s: [cache] should be enabled with a redis_url", path)
	}
	checkAddr(t, path+": cache.redis_url", cfg.Cache.RedisURL, ports)
	if len(cfg.Providers) == 0 {
		t.Fatalf("%s: no providers", path)
	}
	for _, p := range cfg.Providers {
		checkAddr(t, path+": "+p.Name+".api_base", p.APIBase, ports)
		if p.KVEvents == nil {
			t.Errorf("%s: %s has no kv_events", path, p.Name)
			continue
		}
		checkAddr(t, path+": "+p.Name+".kv_events.endpoint", p.KVEvents.Endpoint, ports)
		checkAddr(t, path+": "+p.Name+".kv_events.replay_endpoint", p.KVEvents.ReplayEndpoint, ports)
	}
}

func TestCompose(t *testing.T) {
	cf := loadCompose(t, "docker-compose.yml")
	cs := composeContainers(t, cf)
	ports := func(host string) []int { return servicePorts(cf, cs, host) }
	count := map[string]int{}
	for _, c := range cs {
		count[c.bin.name]++
	}
	want := map[string]int{"rolter-controlplane": 2, "rolter-proxy": 3, "rolter-kvwatcher": 2, "vllmsim": 3, "rolterctl": 1}
	for k, n := range want {
		if count[k] != n {
			t.Errorf("docker-compose.yml: %d %s services, want %d", count[k], k, n)
		}
	}
	for name, c := range cs {
		for _, f := range []string{"controlplane", "nats", "etcd"} {
			for _, a := range strings.Split(c.vals[f], ",") {
				if a != "" {
					checkAddr(t, c.where+": --"+f, a, ports)
				}
			}
		}
		if c.bin.name == "rolter-controlplane" && strings.Count(c.vals["etcd"], ",") != 2 {
			t.Errorf("%s: --etcd should list the 3 etcd nodes", name)
		}
		if c.bin.name == "rolter-proxy" && strings.Count(c.vals["controlplane"], ",") != 1 {
			t.Errorf("%s: --controlplane should list both control planes", name)
		}
		if c.bin.name == "rolter-kvwatcher" && (c.vals["config"] == "") == (c.vals["controlplane"] == "") {
			t.Errorf("%s: the kvwatcher needs exactly one of --config and --controlplane", name)
		}
		checkFollower(t, c)
		checkStateFiles(t, c, keptByCompose(t, cf, c, cf.services[name]))
		// Files given by flag are mounted.
		if f := c.vals["config"] + c.vals["f"]; f != "" {
			checkMounted(t, c.where, cf.services[name], f)
		}
	}
	for _, c := range cs {
		if c.bin.name == "rolterctl" {
			_, rest, _ := parseArgs(mustInfo(t, "rolterctl").flags, c.args)
			f, _, _ := parseArgs(mustInfo(t, "rolterctl").sub["apply"], rest[1:])
			checkMounted(t, c.where, cf.services[strings.TrimPrefix(c.where, cf.path+": ")], f["f"])
		}
	}
	checkConfig(t, filepath.Join(repo, "deploy", "compose", "rolter.toml"), ports)

	// HAProxy: TCP mode, one server per proxy on the proxies' port, checked
	// on /readyz.
	data, err := os.ReadFile(filepath.Join(repo, "deploy", "compose", "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	hc := string(data)
	for _, want := range []string{"mode tcp", "http-check send meth GET uri /readyz"} {
		if !strings.Contains(hc, want) {
			t.Errorf("haproxy.cfg: missing %q", want)
		}
	}
	servers := regexp.MustCompile(`(?m)^\s*server (\S+) (\S+)`).FindAllStringSubmatch(hc, -1)
	var proxies []string
	for name, c := range cs {
		if c.bin.name == "rolter-proxy" {
			proxies = append(proxies, name)
		}
	}
	if len(servers) != len(proxies) {
		t.Errorf("haproxy.cfg: %d servers for %d proxies", len(servers), len(proxies))
	}
	for _, s := range servers {
		checkAddr(t, "haproxy.cfg: server "+s[1], s[2], ports)
		host, _, _ := strings.Cut(s[2], ":")
		if c := cs[host]; c == nil || c.bin.name != "rolter-proxy" {
			t.Errorf("haproxy.cfg: server %s is not a rolter proxy", s[2])
		}
	}
	if lb := cf.services["haproxy"]; lb == nil {
		t.Error("docker-compose.yml: no haproxy service")
	} else {
		checkMounted(t, "haproxy", lb, "/usr/local/etc/haproxy/haproxy.cfg")
	}

	// Drain: a proxy keeps serving after SIGTERM for longer than HAProxy
	// takes to see its /readyz fail (inter × fall), and compose waits for
	// the delay and the drain timeout before it kills the proxy. A refused
	// connection is redispatched.
	if !strings.Contains(hc, "option redispatch") {
		t.Error("haproxy.cfg: no option redispatch")
	}
	chk := regexp.MustCompile(`default-server check inter (\S+) fall (\d+)`).FindStringSubmatch(hc)
	if chk == nil {
		t.Fatal("haproxy.cfg: no default-server check inter ... fall ...")
	}
	inter, err := time.ParseDuration(chk[1])
	if err != nil {
		t.Fatalf("haproxy.cfg: inter %q: %v", chk[1], err)
	}
	fall, _ := strconv.Atoi(chk[2])
	for _, name := range proxies {
		c := cs[name]
		delay, timeout := time.Duration(0), 30*time.Second // rolter-proxy's defaults
		for k, d := range map[string]*time.Duration{"drain-delay": &delay, "drain-timeout": &timeout} {
			if v, ok := c.vals[k]; ok {
				if *d, err = time.ParseDuration(v); err != nil {
					t.Errorf("%s: --%s: %v", c.where, k, err)
				}
			}
		}
		if detect := inter * time.Duration(fall); delay <= detect {
			t.Errorf("%s: --drain-delay %v does not outlast HAProxy's %v to notice a failing /readyz", c.where, delay, detect)
		}
		grace, err := time.ParseDuration(fmt.Sprint(cf.services[name]["stop_grace_period"]))
		if err != nil || grace < delay+timeout {
			t.Errorf("%s: stop_grace_period %v (%v) < --drain-delay %v + --drain-timeout %v", c.where, cf.services[name]["stop_grace_period"], err, delay, timeout)
		}
	}
}

// checkFollower checks a node following control planes (a proxy or a
// kvwatcher with --controlplane): it has a node token (--token,
// --token-file or $ROLTER_NODE_TOKEN), and the binary reads the token
// variable it is given; off loopback it says how it dials them, since
// without a flag both binaries use TLS with the system roots (pkg/tlsflags),
// which verify neither a plaintext control plane nor a private CA's
// certificate.
func checkFollower(t *testing.T, c *container) {
	t.Helper()
	if c.vals == nil || c.vals["controlplane"] == "" || (c.bin.name != "rolter-proxy" && c.bin.name != "rolter-kvwatcher") {
		return
	}
	if c.vals["token"] == "" && c.vals["token-file"] == "" && !slices.Contains(c.env, "ROLTER_NODE_TOKEN") {
		t.Errorf("%s: %s follows a control plane without a node token (--token, --token-file or ROLTER_NODE_TOKEN)", c.where, c.bin.name)
	}
	loopback := true
	for _, a := range strings.Split(c.vals["controlplane"], ",") {
		host, _, _ := net.SplitHostPort(strings.TrimSpace(a))
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			loopback = false
		}
	}
	_, insecure := c.vals["controlplane-insecure"]
	_, sysRoots := c.vals["controlplane-tls"]
	if !loopback && !insecure && !sysRoots && c.vals["controlplane-ca"] == "" {
		t.Errorf("%s: %s dials %s with TLS and the system roots by default: give --controlplane-insecure (plaintext) or --controlplane-ca",
			c.where, c.bin.name, c.vals["controlplane"])
	}
}

// checkStateFiles checks the files a node keeps across its restarts: a
// proxy or kvwatcher following control planes has --snapshot-cache (so
// that, restarted while none answers, it starts from the last config rather
// than from nothing), and that file and --routing-state lie where kept(path)
// says they outlive the container.
func checkStateFiles(t *testing.T, c *container, kept func(path string) bool) {
	t.Helper()
	if c.vals == nil || (c.bin.name != "rolter-proxy" && c.bin.name != "rolter-kvwatcher") {
		return
	}
	if c.vals["controlplane"] != "" && c.vals["snapshot-cache"] == "" {
		t.Errorf("%s: %s follows a control plane without --snapshot-cache: restarted while none answers, it would start with no config", c.where, c.bin.name)
	}
	for _, f := range []string{"snapshot-cache", "routing-state"} {
		if path := c.vals[f]; path != "" && !kept(path) {
			t.Errorf("%s: --%s %s is not on a writable volume kept across the container's restarts", c.where, f, path)
		}
	}
}

// followerTLSFlags are the control-plane TLS flags of the proxy and the
// kvwatcher (pkg/tlsflags).
var followerTLSFlags = []string{"controlplane-ca", "controlplane-tls", "controlplane-insecure", "controlplane-cert", "controlplane-key"}

// TestFollowerTLSFlags: rolter-proxy and rolter-kvwatcher print the same
// control-plane TLS flags in their -h, with the same help and defaults, so
// a manifest can give both the same ones.
func TestFollowerTLSFlags(t *testing.T) {
	if _, err := loadInfos(); err != nil {
		t.Fatal(err)
	}
	// One flag's entry in -h: its line and the indented help below it.
	entries := func(name string) map[string]string {
		out, _ := exec.Command(filepath.Join(binDir, name), "-h").CombinedOutput()
		got := map[string]string{}
		cur := ""
		for _, line := range strings.Split(string(out), "\n") {
			if m := usageRe.FindStringSubmatch(line); m != nil {
				cur = m[1]
				got[cur] = line
			} else if cur != "" && strings.HasPrefix(line, "    ") {
				got[cur] += "\n" + line
			}
		}
		return got
	}
	proxy, kv := entries("rolter-proxy"), entries("rolter-kvwatcher")
	for _, f := range followerTLSFlags {
		if proxy[f] == "" || kv[f] == "" {
			t.Errorf("--%s: rolter-proxy %q, rolter-kvwatcher %q: both should define it", f, proxy[f], kv[f])
		} else if proxy[f] != kv[f] {
			t.Errorf("--%s differs:\nrolter-proxy:\n%s\nrolter-kvwatcher:\n%s", f, proxy[f], kv[f])
		}
	}
}

func mustInfo(t *testing.T, name string) *binInfo {
	infos, err := loadInfos()
	if err != nil {
		t.Fatal(err)
	}
	return infos[name]
}

func checkMounted(t *testing.T, where string, svc map[string]any, file string) {
	t.Helper()
	for _, v := range l(svc["volumes"]) {
		parts := strings.Split(fmt.Sprint(v), ":")
		if len(parts) >= 2 && (parts[1] == file || strings.HasPrefix(file, parts[1]+"/")) {
			if strings.HasPrefix(parts[0], ".") {
				if _, err := os.Stat(filepath.Join(repo, "deploy", "compose", parts[0])); err != nil {
					t.Errorf("%s: mount source: %v", where, err)
				}
			}
			return
		}
	}
	t.Errorf("%s: %s is not mounted", where, file)
}

func TestComposeVLLMOverride(t *testing.T) {
	base := loadCompose(t, "docker-compose.yml")
	over := loadCompose(t, "docker-compose.vllm.yml")
	cs := composeContainers(t, base)
	sims := 0
	for name, c := range cs {
		if c.bin.name != "vllmsim" {
			continue
		}
		sims++
		svc, ok := over.services[name]
		if !ok {
			t.Errorf("docker-compose.vllm.yml: does not replace simulator %s", name)
			continue
		}
		if !strings.Contains(fmt.Sprint(svc["image"]), "vllm/vllm-openai") {
			t.Errorf("docker-compose.vllm.yml: %s: image %v", name, svc["image"])
		}
		if _, hasBuild := svc["build"]; !hasBuild {
			t.Errorf("docker-compose.vllm.yml: %s must reset the simulator's build", name)
		}
		args := strs(svc["command"])
		var kv map[string]any
		var port int
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
				if err := json.Unmarshal([]byte(v), &kv); err != nil {
					t.Errorf("%s: --kv-events-config: %v", name, err)
				}
			}
			if v, ok := strings.CutPrefix(a, "--port="); ok {
				port = atoi(v)
			}
		}
		if !slices.Contains(args, "--enable-prefix-caching") {
			t.Errorf("%s: vLLM needs --enable-prefix-caching", name)
		}
		known := []string{"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm", "max_queue_size", "topic"}
		for k := range kv {
			if !slices.Contains(known, k) {
				t.Errorf("%s: --kv-events-config has unknown key %q", name, k)
			}
		}
		if kv["enable_kv_cache_events"] != true || kv["publisher"] != "zmq" {
			t.Errorf("%s: --kv-events-config must enable events with the zmq publisher: %v", name, kv)
		}
		// The same ports and topic as the simulator it replaces.
		sim := cs[name]
		if port != sim.listens["listen"] {
			t.Errorf("%s: vLLM --port=%d, simulator listened on %d", name, port, sim.listens["listen"])
		}
		for key, flag := range map[string]string{"endpoint": "kv-events", "replay_endpoint": "kv-replay"} {
			p, err := portOf(strings.Replace(fmt.Sprint(kv[key]), "*", "0.0.0.0", 1))
			if err != nil || p != sim.listens[flag] {
				t.Errorf("%s: %s %v, simulator used port %d", name, key, kv[key], sim.listens[flag])
			}
		}
		if kv["topic"] != sim.vals["kv-topic"] {
			t.Errorf("%s: topic %v, simulator used %q", name, kv["topic"], sim.vals["kv-topic"])
		}
	}
	if sims != 3 {
		t.Errorf("docker-compose.yml: %d simulators, want 3", sims)
	}
}

// ---------------------------------------------------------------- Kubernetes

type object struct {
	file string
	doc  map[string]any
}

func (o object) kind() string { return fmt.Sprint(o.doc["kind"]) }
func (o object) name() string { return fmt.Sprint(m(o.doc["metadata"])["name"]) }

func loadK8s(t *testing.T) []object {
	var objs []object
	root := filepath.Join(repo, "deploy", "k8s")
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, doc := range yamlDocs(t, path) {
			if doc["apiVersion"] == nil || doc["kind"] == nil {
				t.Errorf("%s: document without apiVersion/kind", rel)
			}
			objs = append(objs, object{file: rel, doc: doc})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func podSpec(o object) (map[string]any, map[string]any) {
	spec := m(o.doc["spec"])
	switch o.kind() {
	case "Deployment", "StatefulSet", "DaemonSet":
	case "Job":
	default:
		return nil, nil
	}
	tpl := m(spec["template"])
	return m(tpl["spec"]), m(m(tpl["metadata"])["labels"])
}

func selects(sel, labels map[string]any) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// k8sPod is one pod template and its rolter containers.
type k8sPod struct {
	o      object
	labels map[string]any
	ports  map[string]int // name -> port, and "#<n>" -> n
	rolter []*container
	spec   map[string]any
}

func TestKubernetes(t *testing.T) { checkKubernetes(t, loadK8s(t)) }

// checkKubernetes checks a set of manifests (the files as they are, or with
// a component's patches applied) and returns their pods. The kvwatchers
// must follow the control plane rather than read --config.
func checkKubernetes(t *testing.T, objs []object) []k8sPod {
	t.Helper()
	secretKeys := map[string]bool{}
	configFiles := map[string]bool{}
	for _, o := range objs {
		if o.kind() == "Kustomization" {
			for _, g := range l(o.doc["secretGenerator"]) {
				for _, lit := range l(m(g)["literals"]) {
					k, _, _ := strings.Cut(fmt.Sprint(lit), "=")
					secretKeys[fmt.Sprint(m(g)["name"])+"/"+k] = true
				}
			}
			for _, g := range l(o.doc["configMapGenerator"]) {
				for _, f := range l(m(g)["files"]) {
					configFiles[fmt.Sprint(m(g)["name"])+"/"+filepath.Base(fmt.Sprint(f))] = true
					checkK8sFile(t, filepath.Join(repo, "deploy", "k8s", filepath.Dir(o.file), fmt.Sprint(f)))
				}
			}
		}
	}
	type pod = k8sPod
	var pods []pod
	seen := map[string]int{}
	for _, o := range objs {
		spec, labels := podSpec(o)
		if spec == nil {
			continue
		}
		pd := pod{o: o, labels: labels, ports: map[string]int{}, spec: spec}
		for _, cv := range l(spec["containers"]) {
			cm := m(cv)
			where := fmt.Sprintf("%s: %s %s/%s", o.file, o.kind(), o.name(), cm["name"])
			c := &container{where: where, named: map[string]int{}}
			for _, pv := range l(cm["ports"]) {
				p := atoi(m(pv)["containerPort"])
				c.ports = append(c.ports, p)
				pd.ports["#"+strconv.Itoa(p)] = p
				if n, ok := m(pv)["name"].(string); ok {
					c.named[n], pd.ports[n] = p, p
				}
			}
			b := binaryOf(fmt.Sprint(cm["image"]))
			if b == nil {
				continue
			}
			seen[b.name]++
			if cm["command"] != nil {
				t.Errorf("%s: do not override the entrypoint of a rolter image", where)
			}
			c.bin, c.args = b, strs(cm["args"])
			for _, ev := range l(cm["env"]) {
				e := m(ev)
				c.env = append(c.env, fmt.Sprint(e["name"]))
				if ref := m(m(e["valueFrom"])["secretKeyRef"]); ref != nil && !secretKeys[fmt.Sprint(ref["name"])+"/"+fmt.Sprint(ref["key"])] {
					t.Errorf("%s: env %s: no generated secret key %s/%s", where, e["name"], ref["name"], ref["key"])
				}
			}
			for _, pk := range []string{"readinessProbe", "livenessProbe", "startupProbe"} {
				pr := m(cm[pk])
				if pr == nil {
					continue
				}
				for _, kind := range []string{"httpGet", "grpc", "tcpSocket"} {
					if h := m(pr[kind]); h != nil {
						path, _ := h["path"].(string)
						c.probes = append(c.probes, probe{kind: kind, path: path, port: h["port"]})
					}
				}
			}
			// Mounted files named by flags come from a generated ConfigMap.
			mounts := map[string]string{}
			for _, vm := range l(cm["volumeMounts"]) {
				mounts[fmt.Sprint(m(vm)["name"])] = fmt.Sprint(m(vm)["mountPath"])
			}
			checkContainer(t, c)
			for _, f := range []string{c.vals["config"], configFlagOfCtl(t, c)} {
				if f == "" {
					continue
				}
				ok := false
				for _, vv := range l(spec["volumes"]) {
					v := m(vv)
					if cmap := m(v["configMap"]); cmap != nil && mounts[fmt.Sprint(v["name"])] == filepath.Dir(f) &&
						configFiles[fmt.Sprint(cmap["name"])+"/"+filepath.Base(f)] {
						ok = true
					}
				}
				if !ok {
					t.Errorf("%s: %s is not mounted from a generated ConfigMap", where, f)
				}
			}
			checkFollower(t, c)
			checkStateFiles(t, c, func(path string) bool {
				// An emptyDir lives as long as the pod, across its
				// containers' restarts; a claim longer.
				for _, vm := range l(cm["volumeMounts"]) {
					mv := m(vm)
					if mv["readOnly"] == true || !strings.HasPrefix(path, fmt.Sprint(mv["mountPath"])+"/") {
						continue
					}
					for _, vv := range l(spec["volumes"]) {
						if v := m(vv); v["name"] == mv["name"] && (v["emptyDir"] != nil || v["persistentVolumeClaim"] != nil) {
							return true
						}
					}
				}
				return false
			})
			checkSecretFiles(t, c, spec, mounts)
			if c.bin.name == "rolter-kvwatcher" && (c.vals["controlplane"] == "" || c.vals["config"] != "") {
				t.Errorf("%s: the kvwatcher should follow the control plane (--controlplane), not a mounted --config", where)
			}
			pd.rolter = append(pd.rolter, c)
		}
		pods = append(pods, pd)
		if o.kind() == "Deployment" && slices.ContainsFunc(pd.rolter, func(c *container) bool { return c.bin.name == "rolter-proxy" }) {
			checkProxyDeployment(t, o, spec)
		}
	}
	for name := range binaries {
		if seen[name] == 0 {
			t.Errorf("deploy/k8s: no container runs %s", name)
		}
	}

	// Services: every targetPort resolves in the pods they select; the
	// addresses given to flags and in rolter.toml name a Service port.
	svcPorts := map[string][]int{}
	for _, o := range objs {
		if o.kind() != "Service" {
			continue
		}
		spec := m(o.doc["spec"])
		sel := m(spec["selector"])
		var selected []pod
		for _, pd := range pods {
			if selects(sel, pd.labels) {
				selected = append(selected, pd)
			}
		}
		if len(selected) == 0 {
			t.Errorf("%s: Service %s selects no pod", o.file, o.name())
			continue
		}
		for _, pv := range l(spec["ports"]) {
			p := m(pv)
			tp := p["targetPort"]
			if tp == nil {
				tp = p["port"]
			}
			key := fmt.Sprint(tp)
			if _, isInt := tp.(int); isInt {
				key = "#" + key
			}
			for _, pd := range selected {
				if _, ok := pd.ports[key]; !ok {
					t.Errorf("%s: Service %s port %v: targetPort %v is not a port of %s", o.file, o.name(), p["name"], tp, pd.o.name())
				}
			}
			svcPorts[o.name()] = append(svcPorts[o.name()], atoi(p["port"]))
		}
		// Headless Service of a StatefulSet: the pods' own names resolve.
		if spec["clusterIP"] == "None" {
			for _, pd := range selected {
				if pd.o.kind() == "StatefulSet" && m(pd.o.doc["spec"])["serviceName"] == o.name() {
					for i := 0; i < atoi(m(pd.o.doc["spec"])["replicas"]); i++ {
						var ps []int
						for k, p := range pd.ports {
							if strings.HasPrefix(k, "#") {
								ps = append(ps, p)
							}
						}
						svcPorts[fmt.Sprintf("%s-%d.%s", pd.o.name(), i, o.name())] = ps
					}
				}
			}
		}
	}
	ports := func(host string) []int { return svcPorts[host] }
	for _, pd := range pods {
		for _, c := range pd.rolter {
			for _, f := range []string{"controlplane", "nats", "etcd"} {
				for _, a := range strings.Split(c.vals[f], ",") {
					if a != "" {
						checkAddr(t, c.where+": --"+f, a, ports)
					}
				}
			}
		}
	}
	checkConfig(t, filepath.Join(repo, "deploy", "k8s", "base", "rolter.toml"), ports)

	// ServiceMonitors scrape a named Service port on a path its binary serves.
	for _, o := range objs {
		if o.kind() != "ServiceMonitor" {
			continue
		}
		sel := m(m(m(o.doc["spec"])["selector"])["matchLabels"])
		found := false
		for _, s := range objs {
			if s.kind() != "Service" || !selects(sel, m(m(s.doc["metadata"])["labels"])) {
				continue
			}
			found = true
			for _, ev := range l(m(o.doc["spec"])["endpoints"]) {
				e := m(ev)
				var target any
				for _, pv := range l(m(s.doc["spec"])["ports"]) {
					if m(pv)["name"] == e["port"] {
						target = m(pv)["targetPort"]
					}
				}
				if target == nil {
					t.Errorf("%s: ServiceMonitor %s: Service %s has no port %v", o.file, o.name(), s.name(), e["port"])
					continue
				}
				for _, pd := range pods {
					if !selects(m(m(s.doc["spec"])["selector"]), pd.labels) {
						continue
					}
					for _, c := range pd.rolter {
						c.probes = []probe{{kind: "httpGet", path: fmt.Sprint(e["path"]), port: target}}
						c.where = fmt.Sprintf("%s: ServiceMonitor %s", o.file, o.name())
						checkContainer(t, c)
					}
				}
			}
		}
		if !found {
			t.Errorf("%s: ServiceMonitor %s selects no Service", o.file, o.name())
		}
	}
	return pods
}

// configFlagOfCtl returns rolterctl's -f file, if c is rolterctl.
func configFlagOfCtl(t *testing.T, c *container) string {
	if c.bin.name != "rolterctl" {
		return ""
	}
	info := mustInfo(t, "rolterctl")
	_, rest, err := parseArgs(info.flags, c.args)
	if err != nil || len(rest) == 0 {
		return ""
	}
	vals, _, _ := parseArgs(info.sub[rest[0]], rest[1:])
	return vals["f"]
}

func checkK8sFile(t *testing.T, path string) {
	if _, err := os.Stat(path); err != nil {
		t.Error(err)
	}
}

// checkProxyDeployment checks the drain settings of the proxies: a drain
// delay that keeps the pod serving while its endpoint removal spreads, and a
// grace period covering the delay, the drain timeout and any preStop sleep.
func checkProxyDeployment(t *testing.T, o object, spec map[string]any) {
	grace := time.Duration(atoi(spec["terminationGracePeriodSeconds"])) * time.Second
	c := m(l(spec["containers"])[0])
	pre := time.Duration(atoi(m(m(m(c["lifecycle"])["preStop"])["sleep"])["seconds"])) * time.Second
	delay, timeout := time.Duration(0), 30*time.Second // rolter-proxy's defaults
	for _, a := range l(c["args"]) {
		k, v, _ := strings.Cut(fmt.Sprint(a), "=")
		d, err := time.ParseDuration(v)
		switch {
		case k != "--drain-delay" && k != "--drain-timeout":
			continue
		case err != nil:
			t.Errorf("%s: %s: %v", o.file, a, err)
		case k == "--drain-delay":
			delay = d
		default:
			timeout = d
		}
	}
	if pre+delay < 2*time.Second {
		t.Errorf("%s: the proxy stops accepting %v after SIGTERM (preStop %v, --drain-delay %v): too soon for the endpoint removal to spread", o.file, pre+delay, pre, delay)
	}
	if grace < pre+delay+timeout {
		t.Errorf("%s: terminationGracePeriodSeconds %v < preStop %v + --drain-delay %v + --drain-timeout %v", o.file, grace, pre, delay, timeout)
	}
	if m(c["readinessProbe"]) == nil || m(c["livenessProbe"]) == nil {
		t.Errorf("%s: the proxy needs readiness and liveness probes", o.file)
	}
}

// TestKustomizeBuilds renders the overlays when kubectl is installed.
func TestKustomizeBuilds(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed")
	}
	for _, dir := range []string{"base", "overlays/dev"} {
		out, err := exec.Command(kubectl, "kustomize", filepath.Join(repo, "deploy", "k8s", dir)).CombinedOutput()
		if err != nil {
			t.Errorf("kubectl kustomize %s: %v\n%s", dir, err, out)
		}
	}

	// The dev overlay with the TLS components: kustomize renders the same
	// containers as TestKubernetesTLS's reading of the patches.
	tmp := t.TempDir()
	root, err := filepath.Abs(filepath.Join(repo, "deploy", "k8s"))
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(tmp, root)
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\ncomponents: [%s, %s]\n",
		filepath.Join(rel, "overlays", "dev"), filepath.Join(rel, "components", "tls"), filepath.Join(rel, "components", "tls-cert-manager"))
	if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubectl, "kustomize", tmp).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize overlays/dev + components/tls: %v", err)
	}
	rendered := filepath.Join(tmp, "rendered.yaml")
	if err := os.WriteFile(rendered, out, 0o644); err != nil {
		t.Fatal(err)
	}
	args := func(docs []map[string]any) map[string][]string {
		got := map[string][]string{}
		for _, d := range docs {
			o := object{doc: d}
			if spec, _ := podSpec(o); spec != nil {
				for _, cv := range l(spec["containers"]) {
					if binaryOf(fmt.Sprint(m(cv)["image"])) != nil {
						got[o.kind()+"/"+o.name()] = strs(m(cv)["args"])
					}
				}
			}
		}
		return got
	}
	var mine []map[string]any
	for _, o := range withComponent(t, loadK8s(t), "tls") {
		mine = append(mine, o.doc)
	}
	want, got := args(mine), args(yamlDocs(t, rendered))
	if len(got) == 0 {
		t.Fatal("no rolter container rendered")
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("%s: not rendered by kustomize", k)
		}
	}
	for k, a := range got {
		if !slices.Equal(a, want[k]) {
			t.Errorf("%s: kustomize renders %q, TestKubernetesTLS checked %q", k, a, want[k])
		}
	}
	for _, kind := range []string{"Certificate", "Issuer"} {
		if !bytes.Contains(out, []byte("kind: "+kind)) {
			t.Errorf("components/tls-cert-manager: no %s rendered", kind)
		}
	}
}

// ---------------------------------------------------------------- TLS

// tlsFileFlags are the flags naming a certificate, key or CA file.
var tlsFileFlags = []string{"tls-cert", "tls-key", "tls-client-ca", "tls-ca", "controlplane-ca", "controlplane-cert", "controlplane-key"}

// plaintextFlags turn TLS off on the control-plane link.
var plaintextFlags = []string{"insecure", "controlplane-insecure"}

// checkSecretFiles checks that the TLS files a container is given by flag
// are mounted from a Secret that holds them.
func checkSecretFiles(t *testing.T, c *container, spec map[string]any, mounts map[string]string) {
	t.Helper()
	for _, f := range tlsFileFlags {
		file := c.vals[f]
		if file == "" {
			continue
		}
		ok := false
		for _, vv := range l(spec["volumes"]) {
			v := m(vv)
			sec := m(v["secret"])
			if sec == nil || mounts[fmt.Sprint(v["name"])] != filepath.Dir(file) {
				continue
			}
			items := l(sec["items"])
			if len(items) == 0 {
				ok = true // every key of the Secret is a file
			}
			for _, it := range items {
				if m(it)["path"] == filepath.Base(file) {
					ok = true
				}
			}
		}
		if !ok {
			t.Errorf("%s: --%s=%s is not mounted from a Secret", c.where, f, file)
		}
	}
}

// jsonPatch applies RFC 6902 add / replace / remove operations to doc.
func jsonPatch(doc map[string]any, ops []any) error {
	for _, ov := range ops {
		op := m(ov)
		path := fmt.Sprint(op["path"])
		toks := strings.Split(strings.TrimPrefix(path, "/"), "/")
		for i := range toks {
			toks[i] = strings.NewReplacer("~1", "/", "~0", "~").Replace(toks[i])
		}
		// Walk to the parent, keeping a setter for the container the
		// last token indexes into (a list may grow).
		var parent any = doc
		set := func(any) {}
		for _, tok := range toks[:len(toks)-1] {
			switch p := parent.(type) {
			case map[string]any:
				child, ok := p[tok]
				if !ok {
					return fmt.Errorf("%s: no %q", path, tok)
				}
				set = func(v any) { p[tok] = v }
				parent = child
			case []any:
				i, err := strconv.Atoi(tok)
				if err != nil || i < 0 || i >= len(p) {
					return fmt.Errorf("%s: bad index %q", path, tok)
				}
				set = func(v any) { p[i] = v }
				parent = p[i]
			default:
				return fmt.Errorf("%s: %q is not a container", path, tok)
			}
		}
		last := toks[len(toks)-1]
		switch p := parent.(type) {
		case map[string]any:
			_, exists := p[last]
			switch op["op"] {
			case "add":
				p[last] = op["value"]
			case "replace":
				if !exists {
					return fmt.Errorf("replace %s: no such key", path)
				}
				p[last] = op["value"]
			case "remove":
				if !exists {
					return fmt.Errorf("remove %s: no such key", path)
				}
				delete(p, last)
			default:
				return fmt.Errorf("%s: unsupported op %v", path, op["op"])
			}
		case []any:
			i := len(p)
			if last != "-" {
				n, err := strconv.Atoi(last)
				if err != nil || n < 0 || n > len(p) {
					return fmt.Errorf("%s: bad index %q", path, last)
				}
				i = n
			}
			switch op["op"] {
			case "add":
				set(slices.Insert(slices.Clone(p), i, op["value"]))
			case "replace", "remove":
				if i >= len(p) {
					return fmt.Errorf("%s: bad index %q", path, last)
				}
				if op["op"] == "replace" {
					p[i] = op["value"]
				} else {
					set(slices.Delete(slices.Clone(p), i, i+1))
				}
			default:
				return fmt.Errorf("%s: unsupported op %v", path, op["op"])
			}
		default:
			return fmt.Errorf("%s: parent is not a container", path)
		}
	}
	return nil
}

// withComponent returns the manifests outside components/ (the base and
// the dev overlay's resources, plus deps) with the component's inline JSON
// patches applied, and the component's own resources added.
func withComponent(t *testing.T, objs []object, component string) []object {
	t.Helper()
	dir := filepath.Join("components", component)
	var out []object
	var comp map[string]any
	for _, o := range objs {
		switch {
		case o.file == filepath.Join(dir, "kustomization.yaml"):
			comp = o.doc
		case strings.HasPrefix(o.file, "components"+string(filepath.Separator)) && !strings.HasPrefix(o.file, filepath.Join("components", "deps")+string(filepath.Separator)):
			// other optional components are not part of this variant
		case o.kind() == "Kustomization" || o.kind() == "Component":
			out = append(out, o)
		default:
			// A deep copy, so the plain manifests stay as they are.
			b, _ := json.Marshal(o.doc)
			var doc map[string]any
			_ = json.Unmarshal(b, &doc)
			out = append(out, object{file: o.file, doc: doc})
		}
	}
	if comp == nil {
		t.Fatalf("no %s/kustomization.yaml", dir)
	}
	if comp["kind"] != "Component" {
		t.Errorf("%s: kind %v, want Component", dir, comp["kind"])
	}
	for _, r := range l(comp["resources"]) {
		for _, o := range objs {
			if o.file == filepath.Join(dir, fmt.Sprint(r)) {
				out = append(out, o)
			}
		}
	}
	for _, pv := range l(comp["patches"]) {
		p := m(pv)
		target := m(p["target"])
		var ops []any
		if err := yaml.Unmarshal([]byte(fmt.Sprint(p["patch"])), &ops); err != nil || len(ops) == 0 {
			t.Fatalf("%s: patch of %v: only inline JSON 6902 patches are checked here: %v", dir, target, err)
		}
		n := 0
		for _, o := range out {
			if o.kind() == target["kind"] && o.name() == target["name"] {
				n++
				// JSON numbers and YAML ints differ: round-trip the ops.
				b, _ := json.Marshal(ops)
				var jops []any
				_ = json.Unmarshal(b, &jops)
				if err := jsonPatch(o.doc, jops); err != nil {
					t.Errorf("%s: patch of %s %s: %v", dir, target["kind"], target["name"], err)
				}
			}
		}
		if n != 1 {
			t.Errorf("%s: patch target %v matches %d objects", dir, target, n)
		}
	}
	// yamlDocs decodes ints as int; JSON round trips make them float64.
	for i := range out {
		out[i].doc = intify(out[i].doc).(map[string]any)
	}
	return out
}

// intify turns the whole float64s of a JSON round trip back into ints.
func intify(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = intify(e)
		}
	case []any:
		for i, e := range x {
			x[i] = intify(e)
		}
	case float64:
		if x == float64(int(x)) {
			return int(x)
		}
	}
	return v
}

// argsWithout returns c's arguments without the flags named (and their
// values).
func argsWithout(t *testing.T, c *container, drop ...string) []string {
	t.Helper()
	flags := mustInfo(t, c.bin.name).flags
	var out []string
	for i := 0; i < len(c.args); i++ {
		a := c.args[i]
		name, _, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !slices.Contains(drop, name) {
			out = append(out, a)
			continue
		}
		if flags[name] && !hasVal {
			i++ // the flag's value
		}
	}
	return out
}

// TestKubernetesTLS checks components/tls applied to the manifests: every
// flag, mount and address is valid as in TestKubernetes; the control
// planes serve TLS with a mounted certificate, the proxies, the kvwatchers
// and rolterctl verify it with a mounted CA, nothing is left in plaintext,
// and the
// component changes nothing else in the patched arguments.
func TestKubernetesTLS(t *testing.T) {
	plain := loadK8s(t)
	plainPods := map[string][]*container{}
	for _, pd := range checkKubernetes(t, plain) {
		plainPods[pd.o.name()] = pd.rolter
	}
	objs := withComponent(t, plain, "tls")
	var secret string
	hosts := map[string]bool{}
	for _, pd := range checkKubernetes(t, objs) {
		for i, c := range pd.rolter {
			where := pd.o.file + ": " + pd.o.kind() + " " + pd.o.name()
			for _, f := range plaintextFlags {
				if _, ok := c.vals[f]; ok {
					t.Errorf("%s: --%s with components/tls", where, f)
				}
			}
			var want, dropped, added []string
			switch c.bin.name {
			case "rolter-controlplane":
				want, dropped, added = []string{"tls-cert", "tls-key"}, []string{"insecure"}, []string{"tls-cert", "tls-key", "tls-client-ca"}
			case "rolter-proxy", "rolter-kvwatcher":
				want, dropped, added = []string{"controlplane", "controlplane-ca"}, []string{"controlplane-insecure"}, []string{"controlplane-ca", "controlplane-cert", "controlplane-key"}
			case "rolterctl":
				want, dropped, added = []string{"tls-ca"}, []string{"insecure"}, []string{"tls-ca", "tls-server-name"}
			default:
				continue
			}
			for _, f := range want {
				if c.vals[f] == "" {
					t.Errorf("%s: %s without --%s", where, c.bin.name, f)
				}
			}
			for _, f := range []string{"controlplane"} {
				for _, a := range strings.Split(c.vals[f], ",") {
					if host, _, err := net.SplitHostPort(a); err == nil {
						hosts[host] = true
					}
				}
			}
			if c.bin.name == "rolterctl" {
				hosts[strings.Split(c.vals["controlplane"], ":")[0]] = true
			}
			for _, vv := range l(pd.spec["volumes"]) {
				if s := m(m(vv)["secret"]); s != nil && strings.Contains(fmt.Sprint(s["secretName"]), "tls") {
					if secret != "" && secret != s["secretName"] {
						t.Errorf("%s: Secret %v, others use %s", where, s["secretName"], secret)
					}
					secret = fmt.Sprint(s["secretName"])
				}
			}
			// Only the TLS flags change.
			before := plainPods[pd.o.name()]
			if i >= len(before) {
				t.Errorf("%s: container %d is new", where, i)
				continue
			}
			if got, was := argsWithout(t, c, added...), argsWithout(t, before[i], dropped...); !slices.Equal(got, was) {
				t.Errorf("%s: components/tls changes more than the TLS flags:\n got %q\nfrom %q", where, got, was)
			}
		}
	}
	if secret == "" {
		t.Fatal("components/tls mounts no TLS Secret")
	}
	delete(hosts, "")
	if len(hosts) == 0 {
		t.Fatal("no control-plane address found")
	}
	// components/tls-cert-manager issues that Secret for those names.
	found := false
	for _, o := range withComponent(t, plain, "tls-cert-manager") {
		if o.kind() != "Certificate" || fmt.Sprint(m(o.doc["spec"])["secretName"]) != secret {
			continue
		}
		found = true
		spec := m(o.doc["spec"])
		for h := range hosts {
			if !slices.Contains(strs(spec["dnsNames"]), h) {
				t.Errorf("%s: Certificate %s: dnsNames %v lack %q, the address the nodes dial", o.file, o.name(), spec["dnsNames"], h)
			}
		}
		if !slices.Contains(strs(spec["usages"]), "server auth") && spec["usages"] != nil {
			t.Errorf("%s: Certificate %s: usages %v lack server auth", o.file, o.name(), spec["usages"])
		}
		issuer := m(spec["issuerRef"])
		ok := false
		for _, i := range objs {
			if i.kind() == fmt.Sprint(issuer["kind"]) && i.name() == fmt.Sprint(issuer["name"]) {
				ok = true
			}
		}
		for _, i := range withComponent(t, plain, "tls-cert-manager") {
			if i.kind() == fmt.Sprint(issuer["kind"]) && i.name() == fmt.Sprint(issuer["name"]) {
				ok = true
			}
		}
		if !ok {
			t.Errorf("%s: Certificate %s: no %v", o.file, o.name(), issuer)
		}
	}
	if !found {
		t.Errorf("components/tls-cert-manager: no Certificate for the Secret %s", secret)
	}
}

// mergeCompose applies a compose override file the way docker compose
// does for the keys the rolter services use: command replaced, volumes
// merged by container path, environment merged.
func mergeCompose(base, over composeFile) composeFile {
	out := composeFile{path: base.path + "+" + over.path, services: map[string]map[string]any{}, volumes: maps.Clone(base.volumes)}
	maps.Copy(out.volumes, over.volumes)
	for name, svc := range base.services {
		out.services[name] = maps.Clone(svc)
	}
	for name, o := range over.services {
		svc := out.services[name]
		if svc == nil {
			svc = map[string]any{}
			out.services[name] = svc
		}
		for k, v := range o {
			switch k {
			case "volumes":
				var vols []any
				target := func(v any) string {
					parts := strings.Split(fmt.Sprint(v), ":")
					if len(parts) < 2 {
						return parts[0]
					}
					return parts[1]
				}
				for _, bv := range l(svc["volumes"]) {
					if !slices.ContainsFunc(l(v), func(ov any) bool { return target(ov) == target(bv) }) {
						vols = append(vols, bv)
					}
				}
				svc["volumes"] = append(vols, l(v)...)
			case "environment":
				env := maps.Clone(m(svc["environment"]))
				if env == nil {
					env = map[string]any{}
				}
				maps.Copy(env, m(v))
				svc["environment"] = env
			default:
				svc[k] = v
			}
		}
	}
	return out
}

// TestComposeTLS checks docker-compose.tls.yml over docker-compose.yml
// like TestCompose checks the base, plus: the control planes serve TLS and
// nothing is plaintext, every TLS file is mounted from the directory
// gen-dev-ca.sh writes, only the TLS flags change, and (with openssl) the
// script's certificate verifies against its CA for every control-plane
// address the proxies, the kvwatchers and rolterctl dial.
func TestComposeTLS(t *testing.T) {
	base := loadCompose(t, "docker-compose.yml")
	cf := mergeCompose(base, loadCompose(t, "docker-compose.tls.yml"))
	plain := composeContainers(t, base)
	cs := composeContainers(t, cf)
	ports := func(host string) []int { return servicePorts(cf, cs, host) }
	hosts := map[string]bool{}
	for name, c := range cs {
		for _, f := range []string{"controlplane", "nats", "etcd"} {
			for _, a := range strings.Split(c.vals[f], ",") {
				if a != "" {
					checkAddr(t, c.where+": --"+f, a, ports)
				}
			}
		}
		for _, f := range plaintextFlags {
			if _, ok := c.vals[f]; ok {
				t.Errorf("%s: --%s with TLS", c.where, f)
			}
		}
		var want, dropped, added []string
		switch c.bin.name {
		case "rolter-controlplane":
			want, dropped, added = []string{"tls-cert", "tls-key"}, []string{"insecure"}, []string{"tls-cert", "tls-key", "tls-client-ca"}
		case "rolter-proxy", "rolter-kvwatcher":
			want, dropped, added = []string{"controlplane", "controlplane-ca"}, []string{"controlplane-insecure"}, []string{"controlplane-ca", "controlplane-cert", "controlplane-key"}
		case "rolterctl":
			want, dropped, added = []string{"tls-ca"}, []string{"insecure"}, []string{"tls-ca", "tls-server-name"}
		}
		for _, f := range want {
			if c.vals[f] == "" {
				t.Errorf("%s: %s without --%s", c.where, c.bin.name, f)
			}
		}
		for _, f := range tlsFileFlags {
			if file := c.vals[f]; file != "" {
				checkMountedFrom(t, c.where, cf.services[name], file, "./tls")
			}
		}
		checkStateFiles(t, c, keptByCompose(t, cf, c, cf.services[name]))
		for _, a := range strings.Split(c.vals["controlplane"], ",") {
			if host, _, err := net.SplitHostPort(a); err == nil {
				hosts[host] = true
			}
		}
		if got, was := argsWithout(t, c, added...), argsWithout(t, plain[name], dropped...); !slices.Equal(got, was) {
			t.Errorf("%s: docker-compose.tls.yml changes more than the TLS flags:\n got %q\nfrom %q", c.where, got, was)
		}
	}
	if len(hosts) == 0 {
		t.Fatal("no control-plane address found")
	}

	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl not installed: gen-dev-ca.sh not run")
	}
	dir := filepath.Join(t.TempDir(), "tls")
	out, err := exec.Command("sh", filepath.Join(repo, "deploy", "compose", "gen-dev-ca.sh"), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("gen-dev-ca.sh: %v\n%s", err, out)
	}
	if out, err := exec.Command("sh", filepath.Join(repo, "deploy", "compose", "gen-dev-ca.sh"), dir).CombinedOutput(); err == nil {
		t.Errorf("gen-dev-ca.sh overwrote existing certificates:\n%s", out)
	}
	roots := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil || !roots.AppendCertsFromPEM(caPEM) {
		t.Fatalf("ca.crt: %v", err)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatalf("tls.crt / tls.key: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for h := range hosts {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("gen-dev-ca.sh: the certificate does not verify for %s: %v", h, err)
		}
	}
	for _, f := range []string{"ca.crt", "tls.crt", "tls.key"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm()&0o004 == 0 {
			t.Errorf("gen-dev-ca.sh: %s is not readable by the containers' nonroot user: %v %v", f, st.Mode(), err)
		}
	}
}

// checkMountedFrom checks that file is mounted from the host directory dir
// (relative to deploy/compose; it may not exist yet).
func checkMountedFrom(t *testing.T, where string, svc map[string]any, file, dir string) {
	t.Helper()
	for _, v := range l(svc["volumes"]) {
		parts := strings.Split(fmt.Sprint(v), ":")
		if len(parts) >= 2 && strings.HasPrefix(file, parts[1]+"/") && parts[0] == dir {
			return
		}
	}
	t.Errorf("%s: %s is not mounted from %s", where, file, dir)
}

// TestRunScriptMessage checks the commands `make run` prints: its message is
// an unquoted heredoc, where a line ending in one backslash is joined with the
// next by the shell, so a printed multi-line command must end its lines in
// `\\` (printed as `\`).
func TestRunScriptMessage(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repo, "scripts", "run.sh"))
	if err != nil {
		t.Fatal(err)
	}
	start := regexp.MustCompile(`(?m)^cat <<(\w+)$`).FindSubmatchIndex(raw)
	if start == nil {
		t.Fatal("scripts/run.sh: no `cat <<WORD` message found")
	}
	word := string(raw[start[2]:start[3]])
	body, _, ok := strings.Cut(string(raw[start[1]:]), "\n"+word+"\n")
	if !ok {
		t.Fatalf("scripts/run.sh: the heredoc %s is not closed", word)
	}
	for i, line := range strings.Split(body, "\n") {
		trail := len(line) - len(strings.TrimRight(line, `\`))
		if trail%2 == 1 {
			t.Errorf("scripts/run.sh message line %d ends in an odd number of backslashes: the shell joins it with the next line in the printed command\n%s", i, line)
		}
	}
}
