package prefixshare

// SetCapacity bounds what the local index remembers of worker to a KV
// cache of tokens tokens (see prefix.Index.SetCapacity), so a shared index
// is sized from the worker's report as a local one is
// (scheduler.PrefixCapacity). Each replica sizes its own copy from its
// own scrapes; nothing is published.
func (x *Index) SetCapacity(worker string, tokens int) { x.local.SetCapacity(worker, tokens) }
