package kvevents

import (
	"github.com/vmihailenco/msgpack/v5"
)

// Opt is an optional value: a field that vLLM declares as "T | None".
type Opt[T any] struct {
	V     T
	Valid bool // false means None (nil on the wire, or absent from a map)
}

// Some returns a valid Opt holding v.
func Some[T any](v T) Opt[T] { return Opt[T]{V: v, Valid: true} }

// Kind is the type of an [Event], named by vLLM's class names.
type Kind uint8

// The event kinds.
const (
	KindBlockStored Kind = iota + 1
	KindBlockRemoved
	KindAllBlocksCleared
)

// String returns vLLM's class name of the kind (its wire tag).
func (k Kind) String() string {
	switch k {
	case KindBlockStored:
		return tagBlockStored
	case KindBlockRemoved:
		return tagBlockRemoved
	case KindAllBlocksCleared:
		return tagAllBlocksCleared
	default:
		return "Unknown"
	}
}

// The wire tags (class names) of the events.
const (
	tagBlockStored      = "BlockStored"
	tagBlockRemoved     = "BlockRemoved"
	tagAllBlocksCleared = "AllBlocksCleared"
)

// Event is one KV-cache event: a *[BlockStored], a *[BlockRemoved] or a
// *[AllBlocksCleared].
type Event interface {
	Kind() Kind
	isEvent()
}

// BlockStored reports a run of blocks that became resident (vLLM's
// BlockStored). Fields are in vLLM's declaration order, which is the array
// position after the tag; the comment of each says which generation added
// it.
type BlockStored struct {
	// BlockHashes are the engine hashes of the stored blocks, in chain
	// order.
	BlockHashes []Hash
	// ParentBlockHash is the engine hash of the block just before the run;
	// None at the start of a request.
	ParentBlockHash Opt[Hash]
	// TokenIDs are the tokens of the stored blocks, BlockSize per block
	// (empty for an offload tier's placement event).
	TokenIDs []uint32
	// BlockSize is the number of tokens per block.
	BlockSize int
	// LoRAID is the LoRA adapter's int id (deprecated by LoRAName).
	LoRAID Opt[int64]
	// Medium is the tier: "GPU", "CPU", "FS", "OBJ", "STORAGE" (vLLM ≥ ~0.9.2).
	Medium Opt[string]
	// LoRAName is the LoRA adapter's name (#27577).
	LoRAName Opt[string]
	// ExtraKeys holds one entry per block (#33304); nil means None, and a
	// non-nil empty slice an empty list.
	ExtraKeys []ExtraKey
	// GroupIdx is the KV-cache group of a hybrid model (#37688).
	GroupIdx Opt[int64]
	// KVCacheSpecKind is the group's attention kind, e.g. "full_attention"
	// (#40984).
	KVCacheSpecKind Opt[string]
	// KVCacheSpecSlidingWindow is the group's sliding window (#40984).
	KVCacheSpecSlidingWindow Opt[int64]
	// Locality is "LOCAL" or "REMOTE" (#48281, map form only in vLLM).
	Locality Opt[string]
	// Ownership identifies a secondary offloading tier (#52067).
	Ownership Opt[string]
	// SessionID is the request that caused the store (#51381).
	SessionID Opt[string]
}

// BlockRemoved reports evicted blocks (vLLM's BlockRemoved).
type BlockRemoved struct {
	// BlockHashes are the engine hashes of the removed blocks.
	BlockHashes []Hash
	// Medium is the tier the blocks left (vLLM ≥ ~0.9.2).
	Medium Opt[string]
	// GroupIdx is the KV-cache group (#37688).
	GroupIdx Opt[int64]
	// Locality is "LOCAL" or "REMOTE" (#48281).
	Locality Opt[string]
	// Ownership identifies a secondary offloading tier (#52067).
	Ownership Opt[string]
}

// AllBlocksCleared reports that every block of the publisher (the pod or
// DP rank) was dropped, e.g. a prefix-cache reset.
type AllBlocksCleared struct{}

// Kind returns KindBlockStored.
func (*BlockStored) Kind() Kind { return KindBlockStored }

// Kind returns KindBlockRemoved.
func (*BlockRemoved) Kind() Kind { return KindBlockRemoved }

// Kind returns KindAllBlocksCleared.
func (*AllBlocksCleared) Kind() Kind { return KindAllBlocksCleared }

func (*BlockStored) isEvent()      {}
func (*BlockRemoved) isEvent()     {}
func (*AllBlocksCleared) isEvent() {}

// ExtraKey is one entry of BlockStored.extra_keys: the raw msgpack bytes of
// the entry (a tuple of LoRA name, multimodal identifiers, cache salt,
// prompt-embedding digest, ...), or nil for None. The raw bytes are stable
// within one stream, so a consumer can hash them as they are.
type ExtraKey []byte

// Value decodes the entry into generic Go values (nil for None).
func (k ExtraKey) Value() (any, error) {
	if k == nil {
		return nil, nil
	}
	var v any
	err := msgpack.Unmarshal(k, &v)
	return v, err
}

// Form is how the events of a batch are laid out.
type Form uint8

const (
	// FormArray writes each event as a positional array whose element 0 is
	// the class name (vLLM ≤ 0.23).
	FormArray Form = iota + 1
	// FormMap writes each event as a map whose "type" key is the class
	// name, leaving out optional fields that are None (vLLM ≥ 0.24).
	FormMap
)

// String returns "array" or "map".
func (f Form) String() string {
	switch f {
	case FormArray:
		return "array"
	case FormMap:
		return "map"
	default:
		return "unknown"
	}
}

// Layout is how a batch is laid out on the wire: the schema generation. The
// Layout* variables name the generations of vLLM's kv_events.py; [Decode]
// reports the layout it found, and encoding a decoded batch with it gives
// the same bytes back.
type Layout struct {
	// Form is the events' form.
	Form Form
	// NoRank writes a 2-element batch without data_parallel_rank (vLLM
	// 0.9.0 only).
	NoRank bool
	// MapBatch writes the batch itself as a map {ts, events,
	// data_parallel_rank}. No vLLM release sends this; it exists to test
	// consumers against the intermediate upstream commit that did.
	MapBatch bool
	// StoredLen is, in FormArray, the number of elements of a BlockStored
	// array including the tag: 6 (0.9.0), 7 (medium), 8 (lora_name), 9
	// (extra_keys), 10 (group_idx), 12 (kv_cache_spec_*). Zero means 12.
	// Fields past it are not written; positions past the known fields are
	// written as nil.
	StoredLen int
	// RemovedLen is, in FormArray, the number of elements of a
	// BlockRemoved array including the tag: 2, 3 (medium) or 4
	// (group_idx). Zero means 4.
	RemovedLen int
}

// The schema generations (see kv-events.md §1.3).
var (
	// LayoutV09 is vLLM 0.9.0 (G0): 2-element batch, BlockStored of 6.
	LayoutV09 = Layout{Form: FormArray, NoRank: true, StoredLen: 6, RemovedLen: 2}
	// LayoutDPRank is G1: data_parallel_rank added to the batch.
	LayoutDPRank = Layout{Form: FormArray, StoredLen: 6, RemovedLen: 2}
	// LayoutMedium is G2 (≈ vLLM 0.9.2–0.11): medium on both events.
	LayoutMedium = Layout{Form: FormArray, StoredLen: 7, RemovedLen: 3}
	// LayoutLoRAName is G3: lora_name.
	LayoutLoRAName = Layout{Form: FormArray, StoredLen: 8, RemovedLen: 3}
	// LayoutExtraKeys is G4: extra_keys.
	LayoutExtraKeys = Layout{Form: FormArray, StoredLen: 9, RemovedLen: 3}
	// LayoutGroupIdx is G5: group_idx on both events.
	LayoutGroupIdx = Layout{Form: FormArray, StoredLen: 10, RemovedLen: 4}
	// LayoutArray is G6, the last array generation (vLLM ≈ 0.21–0.23,
	// e.g. 0.22): kv_cache_spec_kind and kv_cache_spec_sliding_window.
	LayoutArray = Layout{Form: FormArray, StoredLen: 12, RemovedLen: 4}
	// LayoutMap is G7 and later (vLLM ≥ 0.24): map events.
	LayoutMap = Layout{Form: FormMap}
)

// Field counts of the newest known schema, including the tag.
const (
	maxStoredLen  = 15 // tag + 14 fields
	maxRemovedLen = 6  // tag + 5 fields
	minStoredLen  = 5  // tag + block_hashes, parent, token_ids, block_size
	minRemovedLen = 2  // tag + block_hashes
)

// Batch is a decoded KVEventBatch.
type Batch struct {
	// TS is the publisher's timestamp, in seconds since the epoch.
	TS float64
	// Events are the batch's events that were understood, in order.
	Events []Event
	// DataParallelRank is the publisher's DP rank (absent in vLLM 0.9.0).
	DataParallelRank Opt[int64]
	// Layout is how the batch was laid out on the wire. Its Form is 0 when
	// the batch had no events; its StoredLen and RemovedLen are the lengths
	// of the first array-form BlockStored and BlockRemoved (0 if none).
	Layout Layout

	// UnknownEvents counts events skipped because their type was not one
	// of the three known ones (or had no readable type).
	UnknownEvents int
	// InvalidEvents counts events of a known type skipped because a field
	// had the wrong msgpack type or value (e.g. a string token id, a
	// missing block_hashes).
	InvalidEvents int
	// UnknownFields counts fields skipped because the decoder does not
	// know them: extra map keys, array elements past the newest known
	// field, extra batch elements.
	UnknownFields int
}
