package routing

import (
	"strconv"
	"strings"
)

// TokenIDsHeader carries the prompt's token ids for precise routing.
const TokenIDsHeader = "X-Rolter-Vllm-Token-Ids"

// ParseTokenIDs reads a comma-separated list of unsigned 32-bit token ids.
// Any element that does not parse makes the whole header ignored (nil), as
// does an empty list: a wrong token list would steer precise routing
// wrongly, while none leaves it neutral.
func ParseTokenIDs(h string) []uint32 {
	h = strings.TrimSpace(h)
	if h == "" {
		return nil
	}
	ids := make([]uint32, 0, strings.Count(h, ",")+1)
	for part := range strings.SplitSeq(h, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(part), 10, 32)
		if err != nil {
			return nil
		}
		ids = append(ids, uint32(v))
	}
	return ids
}
