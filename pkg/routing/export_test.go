package routing

// PromptEndMark is promptEnd, for the external tests of what a balancer
// publishes to its peers.
const PromptEndMark = promptEnd
