// Package admin implements the control plane's AdminService: CRUD of
// providers, routes and virtual keys, Apply and Validate of whole TOML
// configs, and Status.
//
// # Overview
//
// Every write goes through [store.Store.Update]: the mutation builds the
// next state from the current one and runs [state.State.Check] on it (the
// same validation and compilation as file mode), so a refused write
// changes nothing and reports every problem with its field path. Key
// secrets are minted here, returned once, and only their peppered digests
// are stored; nothing returned or logged ever holds a secret.
package admin

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"rolter.dev/controlplane/internal/state"
	"rolter.dev/controlplane/internal/store"
	"rolter.dev/pkg/config"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// StatusSource answers Status; the push registry implements it.
type StatusSource interface {
	Status(ctx context.Context) *pb.StatusResponse
}

// Server implements pb.AdminServiceServer. Safe for concurrent use.
type Server struct {
	pb.UnimplementedAdminServiceServer
	store  *store.Store
	pepper []byte
	status StatusSource
	tracer trace.Tracer
	log    *slog.Logger
}

var _ pb.AdminServiceServer = (*Server)(nil)

// New returns the admin service. pepper digests key secrets; tp traces
// every write (nil: not traced).
func New(st *store.Store, pepper []byte, status StatusSource, tp trace.TracerProvider, log *slog.Logger) *Server {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return &Server{store: st, pepper: pepper, status: status, tracer: tp.Tracer(TracerName), log: log.With("component", "admin")}
}

// TracerName is the instrumentation scope of the admin service's spans.
const TracerName = "rolter.dev/controlplane/admin"

// SecretPrefix starts every minted key secret.
const SecretPrefix = "sk-rolter-"

func newSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return SecretPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// update runs a checked mutation and maps its errors. It is traced as an
// admin write.
func (s *Server) update(ctx context.Context, method string, opts store.UpdateOptions, m store.Mutation) (next *state.State, err error) {
	ctx, span, own := s.writeSpan(ctx, method)
	if own {
		defer func() {
			var rev int64
			if next != nil {
				rev = next.Revision
			}
			endWrite(span, rev, err)
			span.End()
		}()
	}
	next, err = s.store.Update(ctx, opts, func(cur *state.State) (*state.State, map[state.ID]int64, error) {
		next, expect, err := m(cur)
		if err != nil {
			return nil, nil, err
		}
		if err := next.Check(); err != nil {
			return nil, nil, err
		}
		if len(cur.Routes) > 0 {
			// A fresh store is built object by object and has no route at
			// first; a store that routes something never goes back to none.
			if err := next.Config().CheckRoutes(); err != nil {
				return nil, nil, err
			}
		}
		return next, expect, nil
	})
	if err != nil {
		return nil, toStatus(ctx, s.log, method, err)
	}
	return next, nil
}

func (s *Server) load(ctx context.Context, method string) (*state.State, error) {
	ld, err := s.store.Load(ctx)
	if err != nil {
		return nil, toStatus(ctx, s.log, method, err)
	}
	return ld.State, nil
}

func expectOf(id state.ID, rev int64) map[state.ID]int64 {
	if rev == 0 {
		return nil
	}
	return map[state.ID]int64{id: rev}
}

// ---- Apply, Validate, GetConfig

// parseDoc parses and checks a whole document, keeping its indexed paths.
func parseDoc(doc string) (*config.Config, error) {
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		if _, ok := violations(err); !ok {
			// A TOML syntax error: no field, only a line and column.
			err = &config.FieldError{Msg: err.Error()}
		}
		return nil, err
	}
	var errs []error
	if cfg.Server.KeyPepper != "" {
		errs = append(errs, &config.FieldError{Path: "server.key_pepper",
			Msg: "not accepted by the control plane: the pepper is a secret it never stores; set ROLTER_KEY_PEPPER on the control plane and the data planes"})
	}
	if err := state.CheckConfig(cfg); err != nil {
		errs = append(errs, state.Unjoin(err)...)
	}
	if err := cfg.CheckRoutes(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return cfg, nil
}

// Validate implements pb.AdminServiceServer.
func (s *Server) Validate(_ context.Context, req *pb.ValidateRequest) (*pb.ValidateResponse, error) {
	_, err := parseDoc(req.GetConfigToml())
	if err == nil {
		return &pb.ValidateResponse{Valid: true}, nil
	}
	vs, _ := violations(err)
	return &pb.ValidateResponse{Violations: vs}, nil
}

// Apply implements pb.AdminServiceServer.
func (s *Server) Apply(ctx context.Context, req *pb.ApplyRequest) (resp *pb.ApplyResponse, err error) {
	const method = "Apply"
	ctx, span, _ := s.writeSpan(ctx, method)
	span.SetAttributes(AttrDryRun.Bool(req.GetDryRun()))
	defer func() {
		endWrite(span, resp.GetRevision(), err)
		if err == nil {
			span.SetAttributes(AttrChanges.Int(len(resp.GetChanges())), AttrApplied.Bool(resp.GetApplied()))
		}
		span.End()
	}()
	cfg, err := parseDoc(req.GetConfigToml())
	if err != nil {
		return nil, toStatus(ctx, s.log, method, err)
	}
	want := state.FromConfig(cfg, s.pepper)
	var changes []state.Change
	m := func(cur *state.State) (*state.State, map[state.ID]int64, error) {
		if e := req.GetExpectedRevision(); e != 0 && cur.Revision != e {
			return nil, nil, &staleError{expected: e, actual: cur.Revision}
		}
		next := want.Clone()
		next.Revision, next.ClusterID, next.Meta = cur.Revision, cur.ClusterID, cur.Meta
		if !req.GetPruneKeys() {
			for _, k := range cur.Keys {
				if _, ok := next.Key(k.Name); !ok {
					next.PutKey(k)
				}
			}
		}
		changes = state.Diff(cur, next)
		return next, nil, nil
	}
	if req.GetDryRun() {
		cur, err := s.load(ctx, method)
		if err != nil {
			return nil, err
		}
		next, _, err := m(cur)
		if err == nil {
			err = next.Check()
		}
		if err != nil {
			return nil, toStatus(ctx, s.log, method, err)
		}
		return &pb.ApplyResponse{Revision: cur.Revision, Changes: changesProto(changes)}, nil
	}
	next, err := s.update(ctx, method, store.UpdateOptions{DropCorrupt: true}, m)
	if err != nil {
		return nil, err
	}
	if len(changes) > 0 {
		s.log.Info("config applied", "revision", next.Revision, "changes", len(changes))
	}
	return &pb.ApplyResponse{Revision: next.Revision, Changes: changesProto(changes), Applied: len(changes) > 0}, nil
}

func changesProto(cs []state.Change) []*pb.Change {
	out := make([]*pb.Change, 0, len(cs))
	for _, c := range cs {
		pc := &pb.Change{Kind: pb.ObjectKind(c.ID.Kind), Name: c.ID.Name, Action: pb.ChangeAction(c.Action)}
		for _, f := range c.Fields {
			pc.Fields = append(pc.Fields, &pb.FieldChange{Path: f.Path, Before: f.Before, After: f.After})
		}
		out = append(out, pc)
	}
	return out
}

// GetConfig implements pb.AdminServiceServer.
func (s *Server) GetConfig(ctx context.Context, _ *pb.GetConfigRequest) (*pb.GetConfigResponse, error) {
	cur, err := s.load(ctx, "GetConfig")
	if err != nil {
		return nil, err
	}
	b, _, err := cur.Render(state.RenderOptions{NoInlineSecrets: true})
	if err != nil {
		return nil, toStatus(ctx, s.log, "GetConfig", err)
	}
	head := "# rolter config at revision " + strconv.FormatInt(cur.Revision, 10) +
		". Virtual keys are digests; inline provider api_key values are not exported.\n"
	return &pb.GetConfigResponse{ConfigToml: head + string(b), Revision: cur.Revision}, nil
}

// ---- providers

func (s *Server) putProvider(ctx context.Context, method string, in *pb.Provider, create bool, expected int64) (*pb.Provider, error) {
	name := in.GetName()
	if name == "" {
		if n, ok := in.GetSpec().AsMap()["name"].(string); ok {
			name = n
		}
	}
	if in.GetSpec() != nil && in.GetSpec().GetFields()["name"] == nil {
		if in.Spec.Fields == nil {
			in.Spec.Fields = map[string]*structpb.Value{}
		}
		in.Spec.Fields["name"] = structValue(name)
	}
	cfg, err := decodeEntry("providers", name, in.GetSpec())
	if err != nil {
		return nil, toStatus(ctx, s.log, method, err)
	}
	p := cfg.Providers[0]
	if in.GetName() != "" && p.Name != in.GetName() {
		return nil, status.Errorf(codes.InvalidArgument, "name %q and spec.name %q differ (rename = create + delete)", in.GetName(), p.Name)
	}
	id := state.ID{Kind: state.KindProvider, Name: p.Name}
	next, err := s.update(ctx, method, store.UpdateOptions{}, func(cur *state.State) (*state.State, map[state.ID]int64, error) {
		old, exists := cur.Provider(p.Name)
		switch {
		case create && exists:
			return nil, nil, &existsError{id}
		case !create && !exists:
			return nil, nil, &notFoundError{id}
		}
		if p.APIKey == redacted {
			p.APIKey = old.APIKey
		}
		next := cur.Clone()
		next.PutProvider(p)
		return next, expectOf(id, expected), nil
	})
	if err != nil {
		return nil, err
	}
	got, _ := next.Provider(p.Name)
	s.log.Info("provider written", "provider", p.Name, "revision", next.Revision)
	return providerProto(got, next.Meta[id]), nil
}

// CreateProvider implements pb.AdminServiceServer.
func (s *Server) CreateProvider(ctx context.Context, req *pb.CreateProviderRequest) (*pb.CreateProviderResponse, error) {
	p, err := s.putProvider(ctx, "CreateProvider", req.GetProvider(), true, 0)
	if err != nil {
		return nil, err
	}
	return &pb.CreateProviderResponse{Provider: p}, nil
}

// UpdateProvider implements pb.AdminServiceServer.
func (s *Server) UpdateProvider(ctx context.Context, req *pb.UpdateProviderRequest) (*pb.UpdateProviderResponse, error) {
	p, err := s.putProvider(ctx, "UpdateProvider", req.GetProvider(), false, req.GetExpectedRevision())
	if err != nil {
		return nil, err
	}
	return &pb.UpdateProviderResponse{Provider: p}, nil
}

func (s *Server) delete(ctx context.Context, method string, id state.ID, expected int64) (int64, error) {
	next, err := s.update(ctx, method, store.UpdateOptions{}, func(cur *state.State) (*state.State, map[state.ID]int64, error) {
		next := cur.Clone()
		if !next.Delete(id) {
			return nil, nil, &notFoundError{id}
		}
		return next, expectOf(id, expected), nil
	})
	if err != nil {
		return 0, err
	}
	s.log.Info("object deleted", "object", id.String(), "revision", next.Revision)
	return next.Revision, nil
}

// DeleteProvider implements pb.AdminServiceServer.
func (s *Server) DeleteProvider(ctx context.Context, req *pb.DeleteProviderRequest) (*pb.DeleteProviderResponse, error) {
	rev, err := s.delete(ctx, "DeleteProvider", state.ID{Kind: state.KindProvider, Name: req.GetName()}, req.GetExpectedRevision())
	if err != nil {
		return nil, err
	}
	return &pb.DeleteProviderResponse{Revision: rev}, nil
}

// GetProvider implements pb.AdminServiceServer.
func (s *Server) GetProvider(ctx context.Context, req *pb.GetProviderRequest) (*pb.GetProviderResponse, error) {
	cur, err := s.load(ctx, "GetProvider")
	if err != nil {
		return nil, err
	}
	id := state.ID{Kind: state.KindProvider, Name: req.GetName()}
	p, ok := cur.Provider(req.GetName())
	if !ok {
		return nil, toStatus(ctx, s.log, "GetProvider", &notFoundError{id})
	}
	return &pb.GetProviderResponse{Provider: providerProto(p, cur.Meta[id])}, nil
}

// ListProviders implements pb.AdminServiceServer.
func (s *Server) ListProviders(ctx context.Context, _ *pb.ListProvidersRequest) (*pb.ListProvidersResponse, error) {
	cur, err := s.load(ctx, "ListProviders")
	if err != nil {
		return nil, err
	}
	out := &pb.ListProvidersResponse{Revision: cur.Revision}
	for _, p := range cur.Providers {
		out.Providers = append(out.Providers, providerProto(p, cur.Meta[state.ID{Kind: state.KindProvider, Name: p.Name}]))
	}
	return out, nil
}

// ---- routes

func (s *Server) putRoute(ctx context.Context, method string, in *pb.Route, create bool, expected int64) (*pb.Route, error) {
	model := in.GetModel()
	if model == "" {
		if n, ok := in.GetSpec().AsMap()["model"].(string); ok {
			model = n
		}
	}
	if in.GetSpec() != nil && in.GetSpec().GetFields()["model"] == nil {
		if in.Spec.Fields == nil {
			in.Spec.Fields = map[string]*structpb.Value{}
		}
		in.Spec.Fields["model"] = structValue(model)
	}
	cfg, err := decodeEntry("routes", model, in.GetSpec())
	if err != nil {
		return nil, toStatus(ctx, s.log, method, err)
	}
	r := cfg.Routes[0]
	if in.GetModel() != "" && r.Model != in.GetModel() {
		return nil, status.Errorf(codes.InvalidArgument, "model %q and spec.model %q differ (rename = create + delete)", in.GetModel(), r.Model)
	}
	id := state.ID{Kind: state.KindRoute, Name: r.Model}
	next, err := s.update(ctx, method, store.UpdateOptions{}, func(cur *state.State) (*state.State, map[state.ID]int64, error) {
		_, exists := cur.Route(r.Model)
		switch {
		case create && exists:
			return nil, nil, &existsError{id}
		case !create && !exists:
			return nil, nil, &notFoundError{id}
		}
		next := cur.Clone()
		next.PutRoute(r)
		return next, expectOf(id, expected), nil
	})
	if err != nil {
		return nil, err
	}
	got, _ := next.Route(r.Model)
	s.log.Info("route written", "route", r.Model, "revision", next.Revision)
	return routeProto(got, next.Meta[id]), nil
}

// CreateRoute implements pb.AdminServiceServer.
func (s *Server) CreateRoute(ctx context.Context, req *pb.CreateRouteRequest) (*pb.CreateRouteResponse, error) {
	r, err := s.putRoute(ctx, "CreateRoute", req.GetRoute(), true, 0)
	if err != nil {
		return nil, err
	}
	return &pb.CreateRouteResponse{Route: r}, nil
}

// UpdateRoute implements pb.AdminServiceServer.
func (s *Server) UpdateRoute(ctx context.Context, req *pb.UpdateRouteRequest) (*pb.UpdateRouteResponse, error) {
	r, err := s.putRoute(ctx, "UpdateRoute", req.GetRoute(), false, req.GetExpectedRevision())
	if err != nil {
		return nil, err
	}
	return &pb.UpdateRouteResponse{Route: r}, nil
}

// DeleteRoute implements pb.AdminServiceServer.
func (s *Server) DeleteRoute(ctx context.Context, req *pb.DeleteRouteRequest) (*pb.DeleteRouteResponse, error) {
	rev, err := s.delete(ctx, "DeleteRoute", state.ID{Kind: state.KindRoute, Name: req.GetModel()}, req.GetExpectedRevision())
	if err != nil {
		return nil, err
	}
	return &pb.DeleteRouteResponse{Revision: rev}, nil
}

// GetRoute implements pb.AdminServiceServer.
func (s *Server) GetRoute(ctx context.Context, req *pb.GetRouteRequest) (*pb.GetRouteResponse, error) {
	cur, err := s.load(ctx, "GetRoute")
	if err != nil {
		return nil, err
	}
	id := state.ID{Kind: state.KindRoute, Name: req.GetModel()}
	r, ok := cur.Route(req.GetModel())
	if !ok {
		return nil, toStatus(ctx, s.log, "GetRoute", &notFoundError{id})
	}
	return &pb.GetRouteResponse{Route: routeProto(r, cur.Meta[id])}, nil
}

// ListRoutes implements pb.AdminServiceServer.
func (s *Server) ListRoutes(ctx context.Context, _ *pb.ListRoutesRequest) (*pb.ListRoutesResponse, error) {
	cur, err := s.load(ctx, "ListRoutes")
	if err != nil {
		return nil, err
	}
	out := &pb.ListRoutesResponse{Revision: cur.Revision}
	for _, r := range cur.Routes {
		out.Routes = append(out.Routes, routeProto(r, cur.Meta[state.ID{Kind: state.KindRoute, Name: r.Model}]))
	}
	return out, nil
}

// ---- keys

// keyUpdate changes one existing key with change and returns it.
func (s *Server) keyUpdate(ctx context.Context, method, name string, expected int64, change func(*config.VirtualKey) error) (*pb.VirtualKey, error) {
	id := state.ID{Kind: state.KindKey, Name: name}
	next, err := s.update(ctx, method, store.UpdateOptions{}, func(cur *state.State) (*state.State, map[state.ID]int64, error) {
		k, ok := cur.Key(name)
		if !ok {
			return nil, nil, &notFoundError{id}
		}
		if err := change(&k); err != nil {
			return nil, nil, err
		}
		next := cur.Clone()
		next.PutKey(k)
		return next, expectOf(id, expected), nil
	})
	if err != nil {
		return nil, err
	}
	k, _ := next.Key(name)
	s.log.Info("key written", "key", name, "change", method, "revision", next.Revision)
	return keyProto(k, next.Meta[id]), nil
}

// CreateKey implements pb.AdminServiceServer.
func (s *Server) CreateKey(ctx context.Context, req *pb.CreateKeyRequest) (*pb.CreateKeyResponse, error) {
	const method = "CreateKey"
	in := req.GetKey()
	name := in.GetName()
	secret := newSecret()
	k := config.VirtualKey{Name: name, KeyDigest: config.DigestKey(s.pepper, secret).String()}
	if err := keyRules(&k, in); err != nil {
		return nil, toStatus(ctx, s.log, method, err)
	}
	id := state.ID{Kind: state.KindKey, Name: name}
	next, err := s.update(ctx, method, store.UpdateOptions{}, func(cur *state.State) (*state.State, map[state.ID]int64, error) {
		if _, ok := cur.Key(name); ok {
			return nil, nil, &existsError{id}
		}
		next := cur.Clone()
		next.PutKey(k)
		return next, nil, nil
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("key created", "key", name, "revision", next.Revision)
	got, _ := next.Key(name)
	return &pb.CreateKeyResponse{Key: keyProto(got, next.Meta[id]), Secret: secret}, nil
}

// UpdateKey implements pb.AdminServiceServer.
func (s *Server) UpdateKey(ctx context.Context, req *pb.UpdateKeyRequest) (*pb.UpdateKeyResponse, error) {
	k, err := s.keyUpdate(ctx, "UpdateKey", req.GetKey().GetName(), req.GetExpectedRevision(), func(k *config.VirtualKey) error {
		return keyRules(k, req.GetKey())
	})
	if err != nil {
		return nil, err
	}
	return &pb.UpdateKeyResponse{Key: k}, nil
}

// RotateKey implements pb.AdminServiceServer.
func (s *Server) RotateKey(ctx context.Context, req *pb.RotateKeyRequest) (*pb.RotateKeyResponse, error) {
	secret := newSecret()
	k, err := s.keyUpdate(ctx, "RotateKey", req.GetName(), req.GetExpectedRevision(), func(k *config.VirtualKey) error {
		k.Key, k.KeyEnv, k.KeyDigest = "", "", config.DigestKey(s.pepper, secret).String()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &pb.RotateKeyResponse{Key: k, Secret: secret}, nil
}

// DisableKey implements pb.AdminServiceServer.
func (s *Server) DisableKey(ctx context.Context, req *pb.DisableKeyRequest) (*pb.DisableKeyResponse, error) {
	k, err := s.keyUpdate(ctx, "DisableKey", req.GetName(), 0, func(k *config.VirtualKey) error { k.Disabled = true; return nil })
	if err != nil {
		return nil, err
	}
	return &pb.DisableKeyResponse{Key: k}, nil
}

// EnableKey implements pb.AdminServiceServer.
func (s *Server) EnableKey(ctx context.Context, req *pb.EnableKeyRequest) (*pb.EnableKeyResponse, error) {
	k, err := s.keyUpdate(ctx, "EnableKey", req.GetName(), 0, func(k *config.VirtualKey) error { k.Disabled = false; return nil })
	if err != nil {
		return nil, err
	}
	return &pb.EnableKeyResponse{Key: k}, nil
}

// DeleteKey implements pb.AdminServiceServer.
func (s *Server) DeleteKey(ctx context.Context, req *pb.DeleteKeyRequest) (*pb.DeleteKeyResponse, error) {
	rev, err := s.delete(ctx, "DeleteKey", state.ID{Kind: state.KindKey, Name: req.GetName()}, req.GetExpectedRevision())
	if err != nil {
		return nil, err
	}
	return &pb.DeleteKeyResponse{Revision: rev}, nil
}

// GetKey implements pb.AdminServiceServer.
func (s *Server) GetKey(ctx context.Context, req *pb.GetKeyRequest) (*pb.GetKeyResponse, error) {
	cur, err := s.load(ctx, "GetKey")
	if err != nil {
		return nil, err
	}
	id := state.ID{Kind: state.KindKey, Name: req.GetName()}
	k, ok := cur.Key(req.GetName())
	if !ok {
		return nil, toStatus(ctx, s.log, "GetKey", &notFoundError{id})
	}
	return &pb.GetKeyResponse{Key: keyProto(k, cur.Meta[id])}, nil
}

// ListKeys implements pb.AdminServiceServer.
func (s *Server) ListKeys(ctx context.Context, _ *pb.ListKeysRequest) (*pb.ListKeysResponse, error) {
	cur, err := s.load(ctx, "ListKeys")
	if err != nil {
		return nil, err
	}
	out := &pb.ListKeysResponse{Revision: cur.Revision}
	for _, k := range cur.Keys {
		out.Keys = append(out.Keys, keyProto(k, cur.Meta[state.ID{Kind: state.KindKey, Name: k.Name}]))
	}
	return out, nil
}

// Status implements pb.AdminServiceServer.
func (s *Server) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	return s.status.Status(ctx), nil
}

// WithDefaultTimeout bounds a call that came without a deadline.
func WithDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, 10*time.Second)
}
