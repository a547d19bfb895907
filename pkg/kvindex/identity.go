package kvindex

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// seedDomain prefixes the model name in [Seed], so that identities never
// collide with other uses of xxh3 over model names.
const seedDomain = "rolter.kv.v1\x00"

// Seed returns the root of the identity chains of model: the parent of every
// chain's first block. model is the model name a request is served under,
// which is what vLLM calls the request's model: the base model's served
// name, or a LoRA adapter's name (the adapter's blocks are reported with
// that name in BlockStored.lora_name). Different names give unrelated
// chains, so blocks of different models or adapters never share an
// identity. It is XXH3-64 (no seed) of "rolter.kv.v1\x00" followed by the
// name's bytes.
func Seed(model string) uint64 { return xxh3.HashString(seedDomain + model) }

// Chain returns the identity of a block whose tokens are tokens and whose
// preceding block has identity parent ([Seed] for a chain's first block):
// XXH3-64 with seed parent over the tokens, each as 4 little-endian bytes.
// Because every identity folds in its parent's, an identity names the whole
// prefix up to and including its block.
func Chain(parent uint64, tokens []uint32) uint64 {
	if len(tokens) == 0 {
		return xxh3.HashSeed(nil, parent)
	}
	if littleEndian {
		return xxh3.HashSeed(unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens)), parent)
	}
	buf := make([]byte, 0, 4*len(tokens))
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	return xxh3.HashSeed(buf, parent)
}

// Identities returns the identities of the full blocks of tokenIDs, blocks
// of blockSize tokens, in chain order, starting from seed (see [Seed]); a
// trailing partial block has none, as an engine caches full blocks only. It
// returns nil when blockSize < 1. It is what the data plane computes for a
// request and what the watcher computes from BlockStored events, so a
// request's identities are resident on a replica exactly when the replica
// reported those blocks stored. It is a pure function, safe for concurrent
// use.
func Identities(seed uint64, tokenIDs []uint32, blockSize int) []uint64 {
	if blockSize < 1 {
		return nil
	}
	return AppendIdentities(make([]uint64, 0, len(tokenIDs)/blockSize), seed, tokenIDs, blockSize)
}

// AppendIdentities appends the identities of the full blocks of tokenIDs to
// dst and returns it (see [Identities]); it lets a caller reuse a buffer.
func AppendIdentities(dst []uint64, seed uint64, tokenIDs []uint32, blockSize int) []uint64 {
	if blockSize < 1 {
		return dst
	}
	parent := seed
	for i := 0; i+blockSize <= len(tokenIDs); i += blockSize {
		parent = Chain(parent, tokenIDs[i:i+blockSize])
		dst = append(dst, parent)
	}
	return dst
}

var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()
