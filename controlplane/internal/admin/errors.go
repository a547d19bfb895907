package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rolter.dev/controlplane/internal/state"
	"rolter.dev/controlplane/internal/store"
	"rolter.dev/pkg/config"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// notFoundError reports a missing object.
type notFoundError struct{ id state.ID }

func (e *notFoundError) Error() string { return e.id.String() + " does not exist" }

// existsError reports a create of an existing object.
type existsError struct{ id state.ID }

func (e *existsError) Error() string { return e.id.String() + " already exists" }

// staleError reports an Apply whose expected config revision is gone.
type staleError struct{ expected, actual int64 }

func (e *staleError) Error() string {
	return fmt.Sprintf("the config is at revision %d, not the expected %d: another change landed first; review it and retry", e.actual, e.expected)
}

// violations lists the field errors joined in err, and reports whether
// every joined error was one (a config refusal rather than a failure).
func violations(err error) ([]*pb.FieldViolation, bool) {
	var out []*pb.FieldViolation
	all := true
	for _, e := range state.Unjoin(err) {
		var fe *config.FieldError
		if errors.As(e, &fe) {
			out = append(out, &pb.FieldViolation{Field: fe.Path, Description: fe.Msg})
		} else {
			all = false
		}
	}
	return out, all && len(out) > 0
}

// toStatus maps an error to the gRPC status clients see. Internal details
// are logged, never returned.
func toStatus(ctx context.Context, log *slog.Logger, method string, err error) error {
	if err == nil {
		return nil
	}
	var etcdErr *store.EtcdError
	if errors.As(err, &etcdErr) {
		if errors.Is(err, context.Canceled) {
			return status.Error(codes.Canceled, "canceled")
		}
		log.Warn("etcd unavailable", "method", method, "err", err)
		return status.Error(codes.Unavailable, "etcd is unavailable; retry")
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var (
		conflict *store.ConflictError
		stale    *staleError
		notFound *notFoundError
		exists   *existsError
		corrupt  *store.CorruptError
	)
	switch {
	case errors.As(err, &conflict), errors.As(err, &stale):
		return status.Error(codes.Aborted, "conflict: "+err.Error())
	case errors.Is(err, store.ErrContention):
		return status.Error(codes.Aborted, err.Error())
	case errors.As(err, &notFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.As(err, &exists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.As(err, &corrupt):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	}
	if vs, ok := violations(err); ok {
		return refusal(vs)
	}
	log.ErrorContext(ctx, "admin call failed", "method", method, "err", err)
	return status.Error(codes.Internal, "internal error")
}

// refusal is INVALID_ARGUMENT with a google.rpc.BadRequest detail.
func refusal(vs []*pb.FieldViolation) error {
	var b strings.Builder
	fmt.Fprintf(&b, "config refused (%d problem", len(vs))
	if len(vs) != 1 {
		b.WriteString("s")
	}
	b.WriteString("):")
	br := &errdetails.BadRequest{}
	for _, v := range vs {
		if v.Field != "" {
			fmt.Fprintf(&b, "\n  %s: %s", v.Field, v.Description)
		} else {
			fmt.Fprintf(&b, "\n  %s", v.Description)
		}
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Description})
	}
	st := status.New(codes.InvalidArgument, b.String())
	if d, err := st.WithDetails(br); err == nil {
		st = d
	}
	return st.Err()
}
