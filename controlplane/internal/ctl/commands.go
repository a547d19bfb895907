package ctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pelletier/go-toml/v2"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"rolter.dev/pkg/config"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

type cmd struct {
	client pb.AdminServiceClient
	out    io.Writer
	errw   io.Writer
	json   bool
}

// kind normalizes "routes", "route" … to the singular.
func kind(s string) string {
	switch strings.TrimSuffix(strings.ToLower(s), "s") {
	case "provider":
		return "provider"
	case "route":
		return "route"
	case "key", "virtual_key", "virtualkey":
		return "key"
	case "config":
		return "config"
	}
	return ""
}

func (c *cmd) dispatch(ctx context.Context, args []string) error {
	verb, rest := args[0], args[1:]
	switch verb {
	case "apply":
		return c.apply(ctx, rest)
	case "validate":
		return c.validate(ctx, rest)
	case "get":
		return c.get(ctx, rest)
	case "list", "ls":
		if len(rest) != 1 {
			return usagef("list providers|routes|keys")
		}
		return c.list(ctx, kind(rest[0]))
	case "delete", "rm":
		return c.delete(ctx, rest)
	case "create", "update":
		return c.put(ctx, verb, rest)
	case "keys", "key":
		return c.keys(ctx, rest)
	case "status":
		return c.status(ctx)
	}
	return usagef("unknown command %q", verb)
}

// sub parses a subcommand's flags; positional arguments may come before
// or after the flags.
func sub(name string, args []string, define func(*flag.FlagSet)) ([]string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	define(fs)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usagef("%s: %v", name, err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func readFile(path string) ([]byte, error) {
	if path == "" {
		return nil, usagef("-f FILE is required")
	}
	if path == "-" {
		return io.ReadAll(os.Stdin)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return b, nil
}

func (c *cmd) apply(ctx context.Context, args []string) error {
	var file string
	var dry, prune bool
	var expected int64
	pos, err := sub("apply", args, func(fs *flag.FlagSet) {
		fs.StringVar(&file, "f", "", "config file (- for stdin)")
		fs.BoolVar(&dry, "dry-run", false, "only show the diff")
		fs.BoolVar(&prune, "prune-keys", false, "also delete stored keys the file does not name")
		fs.Int64Var(&expected, "expected-revision", 0, "refuse unless the stored config is at this revision")
	})
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("apply takes no arguments besides -f FILE")
	}
	doc, err := readFile(file)
	if err != nil {
		return err
	}
	resp, err := c.client.Apply(ctx, &pb.ApplyRequest{ConfigToml: string(doc), DryRun: dry, PruneKeys: prune, ExpectedRevision: expected})
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(resp)
	}
	printChanges(c.out, resp.GetChanges())
	switch {
	case dry:
		fmt.Fprintf(c.out, "dry run: %d change(s) against revision %d, nothing applied\n", len(resp.GetChanges()), resp.GetRevision())
	case resp.GetApplied():
		fmt.Fprintf(c.out, "applied: revision %d\n", resp.GetRevision())
	default:
		fmt.Fprintf(c.out, "no changes: revision %d\n", resp.GetRevision())
	}
	return nil
}

func printChanges(w io.Writer, changes []*pb.Change) {
	for _, ch := range changes {
		what := strings.ToLower(strings.TrimPrefix(ch.GetKind().String(), "OBJECT_KIND_"))
		if ch.GetName() != "" {
			what += " " + strconv.Quote(ch.GetName())
		}
		switch ch.GetAction() {
		case pb.ChangeAction_CHANGE_ACTION_ADDED:
			fmt.Fprintf(w, "+ %s\n", what)
		case pb.ChangeAction_CHANGE_ACTION_REMOVED:
			fmt.Fprintf(w, "- %s\n", what)
		default:
			fmt.Fprintf(w, "~ %s\n", what)
			for _, f := range ch.GetFields() {
				before, after := f.GetBefore(), f.GetAfter()
				if before == "" {
					before = "(unset)"
				}
				if after == "" {
					after = "(unset)"
				}
				fmt.Fprintf(w, "    %s: %s -> %s\n", f.GetPath(), before, after)
			}
		}
	}
}

func (c *cmd) validate(ctx context.Context, args []string) error {
	var file string
	if _, err := sub("validate", args, func(fs *flag.FlagSet) { fs.StringVar(&file, "f", "", "config file") }); err != nil {
		return err
	}
	doc, err := readFile(file)
	if err != nil {
		return err
	}
	resp, err := c.client.Validate(ctx, &pb.ValidateRequest{ConfigToml: string(doc)})
	if err != nil {
		return err
	}
	if c.json {
		if err := c.printJSON(resp); err != nil {
			return err
		}
	} else if resp.GetValid() {
		fmt.Fprintln(c.out, "valid")
	}
	if !resp.GetValid() {
		var b strings.Builder
		fmt.Fprintf(&b, "config refused (%d problem(s)):", len(resp.GetViolations()))
		for _, v := range resp.GetViolations() {
			if v.GetField() != "" {
				fmt.Fprintf(&b, "\n  %s: %s", v.GetField(), v.GetDescription())
			} else {
				fmt.Fprintf(&b, "\n  %s", v.GetDescription())
			}
		}
		return &refusedError{msg: b.String()}
	}
	return nil
}

func (c *cmd) get(ctx context.Context, args []string) error {
	if len(args) == 1 && kind(args[0]) == "config" {
		resp, err := c.client.GetConfig(ctx, &pb.GetConfigRequest{})
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(resp)
		}
		fmt.Fprint(c.out, resp.GetConfigToml())
		return nil
	}
	if len(args) != 2 {
		return usagef("get provider|route|key NAME, or get config")
	}
	switch kind(args[0]) {
	case "provider":
		resp, err := c.client.GetProvider(ctx, &pb.GetProviderRequest{Name: args[1]})
		if err != nil {
			return err
		}
		return c.printEntry(resp, "providers", resp.GetProvider().GetSpec(), resp.GetProvider().GetModRevision())
	case "route":
		resp, err := c.client.GetRoute(ctx, &pb.GetRouteRequest{Model: args[1]})
		if err != nil {
			return err
		}
		return c.printEntry(resp, "routes", resp.GetRoute().GetSpec(), resp.GetRoute().GetModRevision())
	case "key":
		resp, err := c.client.GetKey(ctx, &pb.GetKeyRequest{Name: args[1]})
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(resp)
		}
		return c.keyTable([]*pb.VirtualKey{resp.GetKey()})
	}
	return usagef("get provider|route|key NAME, or get config")
}

// printEntry prints one object as a TOML [[list]] entry (or JSON).
func (c *cmd) printEntry(msg proto.Message, list string, spec *structpb.Struct, rev int64) error {
	if c.json {
		return c.printJSON(msg)
	}
	b, err := toml.Marshal(map[string]any{list: []any{spec.AsMap()}})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "# revision %d\n%s", rev, wholeNumbers(string(b)))
	return nil
}

// wholeNumbers writes JSON numbers that are whole (weight = 2.0) as TOML
// integers, the form rolter.toml uses.
func wholeNumbers(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if k, v, ok := strings.Cut(l, " = "); ok && strings.HasSuffix(v, ".0") {
			if _, err := strconv.ParseInt(strings.TrimSuffix(v, ".0"), 10, 64); err == nil {
				lines[i] = k + " = " + strings.TrimSuffix(v, ".0")
			}
		}
	}
	return strings.Join(lines, "\n")
}

func (c *cmd) list(ctx context.Context, k string) error {
	switch k {
	case "provider":
		resp, err := c.client.ListProviders(ctx, &pb.ListProvidersRequest{})
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(resp)
		}
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tKIND\tAPI_BASE\tREVISION")
		for _, p := range resp.GetProviders() {
			m := p.GetSpec().AsMap()
			fmt.Fprintf(tw, "%s\t%v\t%v\t%d\n", p.GetName(), m["kind"], m["api_base"], p.GetModRevision())
		}
		return tw.Flush()
	case "route":
		resp, err := c.client.ListRoutes(ctx, &pb.ListRoutesRequest{})
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(resp)
		}
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MODEL\tSTRATEGY\tTARGETS\tREVISION")
		for _, r := range resp.GetRoutes() {
			m := r.GetSpec().AsMap()
			var targets []string
			ts, _ := m["targets"].([]any)
			for _, t := range ts {
				if tm, ok := t.(map[string]any); ok {
					targets = append(targets, fmt.Sprint(tm["provider"]))
				}
			}
			list := strings.Join(targets, ",")
			vs, _ := m["variants"].([]any)
			for _, v := range vs {
				// A variant as name:weight[providers], its own targets or the route's.
				vm, _ := v.(map[string]any)
				own := targets
				if vts, ok := vm["targets"].([]any); ok {
					own = nil
					for _, t := range vts {
						if tm, ok := t.(map[string]any); ok {
							own = append(own, fmt.Sprint(tm["provider"]))
						}
					}
				}
				list = strings.TrimSpace(fmt.Sprintf("%s %v:%v[%s]", list, vm["name"], vm["weight"], strings.Join(own, ",")))
			}
			fmt.Fprintf(tw, "%s\t%v\t%s\t%d\n", r.GetModel(), m["strategy"], list, r.GetModRevision())
		}
		return tw.Flush()
	case "key":
		resp, err := c.client.ListKeys(ctx, &pb.ListKeysRequest{})
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(resp)
		}
		return c.keyTable(resp.GetKeys())
	}
	return usagef("list providers|routes|keys")
}

func (c *cmd) keyTable(keys []*pb.VirtualKey) error {
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMODELS\tPROVIDERS\tDISABLED\tEXPIRES\tSECRET\tDIGEST\tREVISION")
	for _, k := range keys {
		exp := "never"
		if k.GetExpiresAt() != nil {
			exp = k.GetExpiresAt().AsTime().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\t%s\t%d\n", k.GetName(), orAll(k.GetModels()), orAll(k.GetProviders()),
			k.GetDisabled(), exp, k.GetSecretSource(), k.GetDigestPrefix(), k.GetModRevision())
	}
	return tw.Flush()
}

func orAll(list []string) string {
	if len(list) == 0 {
		return "*"
	}
	return strings.Join(list, ",")
}

func (c *cmd) delete(ctx context.Context, args []string) error {
	var rev int64
	pos, err := sub("delete", args, func(fs *flag.FlagSet) {
		fs.Int64Var(&rev, "revision", 0, "refuse unless the object is still at this revision")
	})
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usagef("delete provider|route|key NAME")
	}
	var out proto.Message
	var newRev int64
	switch kind(pos[0]) {
	case "provider":
		resp, err := c.client.DeleteProvider(ctx, &pb.DeleteProviderRequest{Name: pos[1], ExpectedRevision: rev})
		if err != nil {
			return err
		}
		out, newRev = resp, resp.GetRevision()
	case "route":
		resp, err := c.client.DeleteRoute(ctx, &pb.DeleteRouteRequest{Model: pos[1], ExpectedRevision: rev})
		if err != nil {
			return err
		}
		out, newRev = resp, resp.GetRevision()
	case "key":
		resp, err := c.client.DeleteKey(ctx, &pb.DeleteKeyRequest{Name: pos[1], ExpectedRevision: rev})
		if err != nil {
			return err
		}
		out, newRev = resp, resp.GetRevision()
	default:
		return usagef("delete provider|route|key NAME")
	}
	if c.json {
		return c.printJSON(out)
	}
	fmt.Fprintf(c.out, "deleted %s %q: revision %d\n", kind(pos[0]), pos[1], newRev)
	if kind(pos[0]) == "key" {
		c.keysLeft(ctx)
	}
	return nil
}

// keysLeft says what a key delete leaves behind: how many keys remain and,
// when none, whether the gateway now refuses everything or is open. It is
// informational: the delete is done whatever it prints.
func (c *cmd) keysLeft(ctx context.Context) {
	resp, err := c.client.GetConfig(ctx, &pb.GetConfigRequest{})
	var cfg *config.Config
	if err == nil {
		cfg, err = config.Parse([]byte(resp.GetConfigToml()))
	}
	if err != nil {
		fmt.Fprintf(c.out, "could not read what is left: %v\n", err)
		return
	}
	n := len(cfg.VirtualKeys)
	switch {
	case n > 0:
		fmt.Fprintf(c.out, "%d %s left; requests need one of them\n", n, plural(n, "key", "keys"))
	case cfg.Server.RequireAuth:
		fmt.Fprintln(c.out, "0 keys left; the gateway refuses every request (server.require_auth = true)")
	default:
		fmt.Fprintln(c.out, "0 keys left; the gateway is OPEN to every client (server.require_auth = false)")
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// entrySpec reads one [[providers]]/[[routes]] entry from a TOML file.
func entrySpec(doc []byte, list string) (*structpb.Struct, error) {
	var m map[string]any
	if err := toml.Unmarshal(doc, &m); err != nil {
		return nil, usagef("%v", err)
	}
	if items, ok := m[list]; ok {
		arr, _ := items.([]any)
		if len(arr) != 1 || len(m) != 1 {
			return nil, usagef("the file must hold exactly one [[%s]] table and nothing else", list)
		}
		m, _ = arr[0].(map[string]any)
	}
	s, err := structpb.NewStruct(jsonish(m).(map[string]any))
	if err != nil {
		return nil, usagef("%v", err)
	}
	return s, nil
}

func jsonish(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = jsonish(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = jsonish(e)
		}
		return x
	case int64:
		return float64(x)
	case time.Time:
		return x.Format(time.RFC3339Nano)
	}
	return v
}

func (c *cmd) put(ctx context.Context, verb string, args []string) error {
	var file string
	var rev int64
	pos, err := sub(verb, args, func(fs *flag.FlagSet) {
		fs.StringVar(&file, "f", "", "entry file")
		if verb == "update" {
			fs.Int64Var(&rev, "revision", 0, "refuse unless the object is still at this revision")
		}
	})
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("%s provider|route -f FILE", verb)
	}
	doc, err := readFile(file)
	if err != nil {
		return err
	}
	var msg proto.Message
	var what string
	var newRev int64
	switch kind(pos[0]) {
	case "provider":
		spec, err := entrySpec(doc, "providers")
		if err != nil {
			return err
		}
		p := &pb.Provider{Spec: spec}
		var got *pb.Provider
		if verb == "create" {
			resp, err := c.client.CreateProvider(ctx, &pb.CreateProviderRequest{Provider: p})
			if err != nil {
				return err
			}
			msg, got = resp, resp.GetProvider()
		} else {
			resp, err := c.client.UpdateProvider(ctx, &pb.UpdateProviderRequest{Provider: p, ExpectedRevision: rev})
			if err != nil {
				return err
			}
			msg, got = resp, resp.GetProvider()
		}
		what, newRev = "provider "+strconv.Quote(got.GetName()), got.GetModRevision()
	case "route":
		spec, err := entrySpec(doc, "routes")
		if err != nil {
			return err
		}
		r := &pb.Route{Spec: spec}
		var got *pb.Route
		if verb == "create" {
			resp, err := c.client.CreateRoute(ctx, &pb.CreateRouteRequest{Route: r})
			if err != nil {
				return err
			}
			msg, got = resp, resp.GetRoute()
		} else {
			resp, err := c.client.UpdateRoute(ctx, &pb.UpdateRouteRequest{Route: r, ExpectedRevision: rev})
			if err != nil {
				return err
			}
			msg, got = resp, resp.GetRoute()
		}
		what, newRev = "route "+strconv.Quote(got.GetModel()), got.GetModRevision()
	default:
		return usagef("%s provider|route -f FILE (keys: rolterctl keys create)", verb)
	}
	if c.json {
		return c.printJSON(msg)
	}
	fmt.Fprintf(c.out, "%sd %s: revision %d\n", verb, what, newRev)
	return nil
}

func (c *cmd) keys(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("keys create|rotate|disable|enable|delete NAME, or keys list")
	}
	verb := args[0]
	switch verb {
	case "list", "ls":
		return c.list(ctx, "key")
	case "delete", "rm":
		return c.delete(ctx, append([]string{"key"}, args[1:]...))
	case "create":
		var models, providers, expires, cache string
		var disabled bool
		pos, err := sub("keys create", args[1:], func(fs *flag.FlagSet) {
			fs.StringVar(&models, "models", "", "allowed models, comma-separated (default all)")
			fs.StringVar(&providers, "providers", "", "allowed providers, comma-separated (default all)")
			fs.StringVar(&expires, "expires", "", "expiry, RFC 3339 (default never)")
			fs.StringVar(&cache, "cache", "", "true or false: override the routes' cache opt-in")
			fs.BoolVar(&disabled, "disabled", false, "create it disabled")
		})
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			return usagef("keys create NAME [flags]")
		}
		k := &pb.VirtualKey{Name: pos[0], Models: split(models), Providers: split(providers), Disabled: disabled}
		if expires != "" {
			t, err := time.Parse(time.RFC3339, expires)
			if err != nil {
				return usagef("--expires: %v", err)
			}
			k.ExpiresAt = timestamppb.New(t)
		}
		if cache != "" {
			b, err := strconv.ParseBool(cache)
			if err != nil {
				return usagef("--cache: %v", err)
			}
			k.Cache = &b
		}
		resp, err := c.client.CreateKey(ctx, &pb.CreateKeyRequest{Key: k})
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(resp)
		}
		fmt.Fprintf(c.out, "key %q created (revision %d). Its secret is shown this once; store it now:\n%s\n",
			resp.GetKey().GetName(), resp.GetKey().GetModRevision(), resp.GetSecret())
		return nil
	case "rotate", "disable", "enable":
		if len(args) != 2 {
			return usagef("keys %s NAME", verb)
		}
		var msg proto.Message
		var key *pb.VirtualKey
		var secret string
		switch verb {
		case "rotate":
			resp, err := c.client.RotateKey(ctx, &pb.RotateKeyRequest{Name: args[1]})
			if err != nil {
				return err
			}
			msg, key, secret = resp, resp.GetKey(), resp.GetSecret()
		case "disable":
			resp, err := c.client.DisableKey(ctx, &pb.DisableKeyRequest{Name: args[1]})
			if err != nil {
				return err
			}
			msg, key = resp, resp.GetKey()
		case "enable":
			resp, err := c.client.EnableKey(ctx, &pb.EnableKeyRequest{Name: args[1]})
			if err != nil {
				return err
			}
			msg, key = resp, resp.GetKey()
		}
		if c.json {
			return c.printJSON(msg)
		}
		if secret != "" {
			fmt.Fprintf(c.out, "key %q rotated (revision %d); the old secret stops working as proxies apply it. New secret, shown this once:\n%s\n",
				key.GetName(), key.GetModRevision(), secret)
		} else {
			fmt.Fprintf(c.out, "key %q %sd (revision %d)\n", key.GetName(), verb, key.GetModRevision())
		}
		return nil
	}
	return usagef("keys create|rotate|disable|enable|delete NAME, or keys list")
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func (c *cmd) status(ctx context.Context) error {
	resp, err := c.client.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(resp)
	}
	fmt.Fprintf(c.out, "config revision %d (answered by %s)\n", resp.GetRevision(), resp.GetControlplaneId())
	if w := resp.GetWarning(); w != "" {
		fmt.Fprintf(c.out, "warning: %s\n", w)
	}
	fmt.Fprintln(c.out)
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTROLPLANE\tREVISION\tNODES")
	for _, cp := range resp.GetControlplanes() {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", cp.GetControlplaneId(), cp.GetRevision(), cp.GetConnectedNodes())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(c.out)
	tw = tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tCONTROLPLANE\tRUNNING\tSENT\tSTATE\tERROR")
	for _, n := range resp.GetNodes() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.GetNodeId(),
			strings.ToLower(strings.TrimPrefix(n.GetRole().String(), "NODE_ROLE_")), n.GetControlplaneId(),
			dash(n.GetAckedVersion()), dash(n.GetSentVersion()),
			strings.ToLower(strings.TrimPrefix(n.GetState().String(), "NODE_STATE_")), oneLine(n.GetErrorDetail()))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", "; ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

func (c *cmd) printJSON(m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: false}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.out, string(b))
	return err
}
