// Package proto_test checks that the generated Go code in proto/ matches
// its .proto sources: it compiles each .proto with protocompile (the
// compiler inside buf) and compares the result with the descriptor
// embedded in the checked-in *.pb.go. A .proto edited without `make proto`
// fails here.
package proto_test

import (
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	controlplanev1 "rolter.dev/proto/rolter/controlplane/v1"
	fleetv1 "rolter.dev/proto/rolter/fleet/v1"
	kvv1 "rolter.dev/proto/rolter/kv/v1"
)

func TestGeneratedDescriptorsMatchSources(t *testing.T) {
	generated := []protoreflect.FileDescriptor{
		controlplanev1.File_rolter_controlplane_v1_controlplane_proto,
		kvv1.File_rolter_kv_v1_kv_proto,
		fleetv1.File_rolter_fleet_v1_fleet_proto,
	}
	checked := map[string]bool{}
	for _, gen := range generated {
		checked[gen.Path()] = true
	}
	err := fs.WalkDir(os.DirFS("../../proto"), ".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(path, ".proto") && !checked[path] {
			t.Errorf("%s is not in this test's list of generated files", path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	c := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{"../../proto"}}),
	}
	for _, gen := range generated {
		files, err := c.Compile(t.Context(), gen.Path())
		if err != nil {
			t.Fatalf("compile %s: %v", gen.Path(), err)
		}
		got, want := normalize(protodesc.ToFileDescriptorProto(files[0])), normalize(protodesc.ToFileDescriptorProto(gen))
		if !proto.Equal(got, want) {
			t.Errorf("%s differs from its generated code: run make proto", gen.Path())
		}
	}
}

// normalize drops what only one side records: source positions and
// derived JSON names.
func normalize(fd *descriptorpb.FileDescriptorProto) *descriptorpb.FileDescriptorProto {
	fd.SourceCodeInfo = nil
	var walk func([]*descriptorpb.DescriptorProto)
	walk = func(msgs []*descriptorpb.DescriptorProto) {
		for _, m := range msgs {
			for _, f := range m.Field {
				f.JsonName = nil
			}
			walk(m.NestedType)
		}
	}
	walk(fd.MessageType)
	return fd
}
