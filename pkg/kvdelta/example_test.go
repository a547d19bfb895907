package kvdelta_test

import (
	"fmt"
	"time"

	"rolter.dev/pkg/kvdelta"
)

func ExampleDecode() {
	m := kvdelta.Message{
		Type: kvdelta.TypeDelta, Epoch: 42, Seq: 7, Provider: "vllm-a",
		Status: kvdelta.Status{KV: true, Synced: true, KVAge: 0, KVStale: 30 * time.Second, BlockSize: 16, Blocks: 2},
		Ops:    []kvdelta.Op{{Kind: kvdelta.OpStored, IDs: []uint64{0xa, 0xb}}},
	}
	b, err := kvdelta.Encode(&m)
	if err != nil {
		panic(err)
	}
	got, err := kvdelta.Decode(b)
	if err != nil {
		panic(err)
	}
	fmt.Println(kvdelta.Subject(got.Provider), got.Type, got.Seq, got.Ops[0].Kind, len(got.Ops[0].IDs), len(b), "bytes")
	// Output:
	// rolter.kv.v1.delta.vllm-a delta 7 stored 2 61 bytes
}
