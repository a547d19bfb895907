// Package prefixtree keeps, for each of a fixed number of tenants (the
// targets of a route), the prompts that tenant has served, and answers "how
// many leading bytes of this prompt does each tenant already hold?" in one
// walk.
//
// # Overview
//
// A [Tree] is ONE compressed radix tree (edges carry byte strings, and every
// node below the root either ends a resident prompt or branches) shared by
// all tenants, as in SGLang's cache-aware router. Each node lists the tenants
// that hold it, with a per-tenant count of the tenant's resident prompts that
// pass through it. Tenant t holds a node iff at least one of t's resident
// prompts passes through it, so a tenant's nodes form a subtree that hangs
// from the root, and [Tree.Match] learns every tenant's longest match from a
// single walk down the prompt: tenant t's match is the depth reached inside
// the deepest node of the walk that t holds. A tenant need not hold a prompt
// that ends where the match ends: a shared prefix of an evicted prompt still
// matches, as in the reference byte trie.
//
// # Node ceiling
//
// A tenant's size is counted in byte nodes: the sum of the label lengths of
// the nodes it holds, which equals the number of distinct non-empty prefixes
// of its resident prompts, i.e. the node count of a byte-per-edge trie of
// them. That keeps "1,000,000 nodes" meaning what it meant for the reference
// trie (one node per byte of distinct prefix) regardless of how the radix tree
// happens to be split. [Tree.Insert] of a prompt that is not resident for the
// tenant adds it, and then, while the tenant holds more than the ceiling,
// evicts the tenant's least recently inserted or re-observed prompt: its
// counts are decremented along its path and the tenant lets go of each node
// whose count reaches zero, so prefixes still used by another of the tenant's
// prompts survive. A node no tenant holds is removed, and a node left with a
// single child and no prompt ending in it is merged with that child, so the
// tree stays compressed. A prompt longer than the ceiling evicts everything
// else and then itself: it is never resident. Inserting a prompt that is
// already resident only refreshes its age.
//
// # Concurrency
//
// A Tree is safe for concurrent use. One sync.RWMutex per tree guards it:
// Match and Stats take the read lock, so matches run in parallel and never
// allocate; Insert takes the write lock for the walk, the new nodes and any
// eviction (a few microseconds for an 8 KiB prompt).
//
// # Memory
//
// Labels are copied out of the caller's string on insert (the tree never
// retains the caller's memory) and again when an edge is split or merged, so
// each label owns exactly its bytes. A node costs a fixed 96 bytes plus its
// children index (9 bytes per child), its tenant list (12 bytes per tenant)
// and its label. Prompts that share long prefixes and differ in long tails,
// which is what LLM traffic looks like, need few nodes per byte, so the tree
// costs little more than one byte per byte node (measured in
// BenchmarkMemoryPerNode).
package prefixtree
