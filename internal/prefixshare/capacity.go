package prefixshare

// SetCapacity bounds what the local index remembers of worker to a KV
// cache of tokens tokens (see prefix.Index.SetCapacity), so a shared index
// is sized from the worker's report as a local one is
// (scheduler.PrefixCapacity). Each replica sizes its own copy from its
// own scrapes; nothing is published.
func (x *Index) SetCapacity(worker string, tokens int) { x.local.SetCapacity(worker, tokens) }

// Correct corrects the local index from what worker reported finding
// cached (see prefix.Index.Correct; scheduler.PrefixCorrector). Each
// replica learns from the answers it relays; nothing is published: the
// other replicas learn the same of the worker from theirs.
func (x *Index) Correct(model, worker string, hashes []uint64, expected, found int) {
	x.local.Correct(model, worker, hashes, expected, found)
}
