package kvindex_test

import (
	"fmt"

	"rolter.dev/pkg/kvindex"
)

// A proxy computes a request's block identities from its token ids, with
// the provider's block size, and asks the index how many leading blocks a
// provider holds.
func ExampleIdentities() {
	tokens := make([]uint32, 40) // 2 full blocks of 16, and 8 tokens that do not fill a block
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	ids := kvindex.Identities(kvindex.Seed("sim-model"), tokens, 16)
	fmt.Println(len(ids))
	// The first block's identity depends only on the model and its tokens.
	fmt.Println(ids[0] == kvindex.Chain(kvindex.Seed("sim-model"), tokens[:16]))
	// Output:
	// 2
	// true
}
