// Package kvevents keeps an exact index of the KV-cache blocks each vLLM
// worker holds, from the events vLLM publishes with --kv-events-config
// (publisher "zmq"), and answers the prefix term's question for requests
// whose token ids are known: how many of the prompt's leading blocks does
// this worker hold now.
//
// # The wire (vllm/distributed/kv_events.py)
//
// A ZeroMQ PUB socket sends multipart messages (topic, seq, payload):
// seq is the batch's sequence number, 8 bytes big-endian, counting from
// 0; payload is a msgpack-encoded KVEventBatch (ts, events,
// data_parallel_rank) whose events are a tagged union of BlockStored
// (block_hashes, parent_block_hash, token_ids, block_size, lora_id,
// medium, lora_name, ...), BlockRemoved (block_hashes, medium, ...) and
// AllBlocksCleared. vLLM encodes them with msgspec: as arrays, the tag
// first then the fields in declaration order (array_like structs, in the
// releases that declare them so), or as maps with a "type" tag; Decode
// reads both. A block hash is an int or bytes (ExternalBlockHash). A
// ROUTER socket at replay_endpoint answers a request (the start seq, 8
// bytes big-endian, after an empty delimiter frame) with every buffered
// batch from there, each as (seq, payload), then (-1, empty).
//
// # The index's keys
//
// vLLM's block hash is sha256 (or another configured function) of a
// pickled or CBOR-encoded tuple of the parent hash, the block's tokens
// and extra keys, which is hard to reproduce outside Python exactly. As
// llm-d's kv-cache-manager does, the index does not try: BlockStored
// carries the stored blocks' token ids, so the index keys each block by
// its own chained hash (BlockKeys: FNV-1a over the parent's key and the
// block's token ids) and keeps vLLM's hash only to map BlockRemoved and
// the next BlockStored's parent onto it. A request's token ids are cut
// and hashed the same way, so a match on the index's keys is a match on
// the tokens the worker holds. Adapters (lora_name) and extra keys
// (multimodal, cache salt) change vLLM's hash but not these keys; a
// worker holding the same tokens under another adapter is counted as
// holding them, which overstates its match for such requests.
//
// # Gaps
//
// A seq that skips one means batches were lost (the PUB socket drops
// what a slow subscriber cannot take). The subscriber then asks the
// replay socket for the batches from the first one missed and applies
// them in order; when there is no replay socket, or it no longer holds
// them, the worker's index is marked out of sync: the prefix term goes
// back to the router's guess for that worker, and the decision record
// says so, until an AllBlocksCleared makes the index exact again.
//
// # Connections and restarts
//
// The subscriber dials for as long as it runs, with backoff (1s doubling
// to 30s), as a vLLM opens its socket only once its model is loaded; a
// lost connection is dialed again the same way. Every connection starts
// the worker's index over, and so does a seq that goes back (vLLM counts
// from 0 in each process): a restarted engine holds none of the blocks
// its previous process published. The first batch then finds its
// predecessors missing and has them replayed from the publisher's
// buffer, as for any gap.
package kvevents
