package shared

import (
	"encoding/binary"
	"math"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts, which keep the leases and counts the package doc
// describes. A lease is a member "worker/lease-id" of one ZSET, scored by
// its expiry in ms on the server's clock (TIME), so expiry does not depend
// on the replicas' clocks agreeing. A script reaps the oldest 256 expired
// leases at most; the next script takes the rest.

// prelude defines now (ms on the server's clock) and reap(leases, counts).
const prelude = `
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function reap(kl, kc)
  local dead = redis.call('ZRANGEBYSCORE', kl, '-inf', nowms, 'LIMIT', 0, 256)
  if #dead == 0 then return end
  for _, m in ipairs(dead) do
    local w = string.sub(m, 1, string.find(m, '/', 1, true) - 1)
    if redis.call('HINCRBY', kc, w, -1) <= 0 then redis.call('HDEL', kc, w) end
  end
  redis.call('ZREM', kl, unpack(dead))
end
`

// pickScript picks and reserves one worker.
//
// KEYS: 1 pick sequence (string), 2 last-pick hash (worker -> sequence),
// 3 waiting list of the model (ZSET member -> enqueue µs), 4 waiter expiry
// (ZSET member -> expiry ms), 5 leases, 6 in-flight counts.
// ARGV: 1 lease id, 2 lease TTL ms, 3 waiter member ("" for a request that
// never queued), 4 this replica's member prefix ("replica|"), 5 the
// candidates packed by packCandidates: two MessagePack arrays, the names,
// then score without the active term, active weight and limit of each;
// 6 the wake-up channel. One cmsgpack.unpack turns the candidates into
// Lua strings and numbers at once, where text arguments would cost Redis
// a string per argument and a tonumber per number.
//
// The turn is the replica's whose waiter is the oldest of the model: any
// request of that replica may go (its own queue order chose it, and may
// have let a cheaper one overtake its oldest), the others' wait. Comparing
// each request's own age instead would deadlock two replicas whose queues
// each picked a request younger than one of the other's. A waiter
// bound here leaves the waiting list; when that hands the turn to
// another replica's waiter the script publishes a wake-up, as leaving it
// by Unwait does, or that replica would wait for the next release.
//
// The in-flight counts come from one HGETALL while the hash holds no more
// than twice the candidates, else from HMGET: Redis keeps a small hash as
// one packed list (a listpack, up to hash-max-listpack-entries fields),
// which HMGET scans once per name and HGETALL walks once. The last picks
// are read only for the candidates tied at the lowest total, the only
// ones they can decide between.
//
// Returns {"ok", index (1-based), actives...}, {"full", actives...} or
// {"turn", oldest member}. actives are the shared in-flight counts before
// the pick, in candidate order.
var pickScript = redis.NewScript(prelude + `
local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', nowms)
if #dead > 0 then
  redis.call('ZREM', KEYS[3], unpack(dead))
  redis.call('ZREM', KEYS[4], unpack(dead))
end
local me, mine = ARGV[3], ARGV[4]
local oldest = redis.call('ZRANGE', KEYS[3], 0, 0)
if #oldest > 0 and string.sub(oldest[1], 1, #mine) ~= mine then
  return {'turn', oldest[1]}
end
reap(KEYS[5], KEYS[6])
local names, nums = cmsgpack.unpack(ARGV[5])
local n = #names
local actives
if redis.call('HLEN', KEYS[6]) <= 2 * n then
  local all, by = redis.call('HGETALL', KEYS[6]), {}
  for i = 1, #all, 2 do by[all[i]] = all[i + 1] end
  actives = {}
  for i = 1, n do actives[i] = by[names[i]] or false end
else
  actives = redis.call('HMGET', KEYS[6], unpack(names))
end
local best, bestTotal, ties, tied = 0, 0, 0, {}
for i = 1, n do
  -- a count is HINCRBY's integer or false
  local active = actives[i]
  if active then active = active + 0 else active = 0 end
  if active < 0 then active = 0 end
  actives[i] = active
  local b = 3 * i
  if active < nums[b] then
    local total = nums[b - 2] + nums[b - 1] * active
    if best == 0 or total < bestTotal then
      best, bestTotal, ties = i, total, 1
      tied[1] = i
    elseif total == bestTotal then
      ties = ties + 1
      tied[ties] = i
    end
  end
end
if best == 0 then
  table.insert(actives, 1, 'full')
  return actives
end
if ties > 1 then
  -- the least recently picked of the tied; never picked counts as 0,
  -- equal last picks go to the first in candidate order
  local tn = {}
  for j = 1, ties do tn[j] = names[tied[j]] end
  local lasts = redis.call('HMGET', KEYS[2], unpack(tn))
  local bestLast = tonumber(lasts[1]) or 0
  for j = 2, ties do
    local last = tonumber(lasts[j]) or 0
    if last < bestLast then best, bestLast = tied[j], last end
  end
end
local w = names[best]
local seq = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], w, seq)
redis.call('ZADD', KEYS[5], nowms + tonumber(ARGV[2]), w .. '/' .. ARGV[1])
redis.call('HINCRBY', KEYS[6], w, 1)
if me ~= '' then
  redis.call('ZREM', KEYS[4], me)
  if redis.call('ZREM', KEYS[3], me) > 0 then
    local nxt = redis.call('ZRANGE', KEYS[3], 0, 0)
    if #nxt > 0 and string.sub(nxt[1], 1, #mine) ~= mine then
      redis.call('PUBLISH', ARGV[6], 'turn')
    end
  end
end
table.insert(actives, 1, best)
table.insert(actives, 1, 'ok')
return actives
`)

// releaseScript removes a lease and, if it was there, tells every replica
// a slot freed. KEYS: 1 leases, 2 in-flight counts. ARGV: 1 the worker,
// 2 the lease id, 3 the wake-up channel.
var releaseScript = redis.NewScript(`
local n = redis.call('ZREM', KEYS[1], ARGV[1] .. '/' .. ARGV[2])
if n > 0 then
  if redis.call('HINCRBY', KEYS[2], ARGV[1], -1) <= 0 then redis.call('HDEL', KEYS[2], ARGV[1]) end
  redis.call('PUBLISH', ARGV[3], ARGV[1])
end
return n
`)

// renewScript extends (or re-creates, after Redis lost them) a replica's
// leases and waiters. KEYS: 1 leases, 2 in-flight counts, then the waiting
// list and waiter-expiry ZSET of each waiter. ARGV: 1 TTL ms, 2 number of
// leases, then per lease its worker and id, then per waiter its member
// and enqueue µs. Returns how many leases and waiters were missing and are
// now back.
var renewScript = redis.NewScript(prelude + `
reap(KEYS[1], KEYS[2])
local exp = nowms + tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local missing = 0
for i = 1, n do
  local w = ARGV[1 + 2 * i]
  if redis.call('ZADD', KEYS[1], exp, w .. '/' .. ARGV[2 + 2 * i]) == 1 then
    redis.call('HINCRBY', KEYS[2], w, 1)
    missing = missing + 1
  end
end
local a = 3 + 2 * n
for i = 3, #KEYS, 2 do
  local m = ARGV[a]
  missing = missing + redis.call('ZADD', KEYS[i], 'NX', ARGV[a + 1], m)
  redis.call('ZADD', KEYS[i + 1], exp, m)
  a = a + 2
end
return missing
`)

// waitScript puts a request on its model's waiting list at the server's
// time. KEYS: 1 waiting list, 2 waiter expiry. ARGV: 1 member, 2 TTL ms.
// Returns the enqueue time in µs.
var waitScript = redis.NewScript(`
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowms = math.floor(us / 1000)
redis.call('ZADD', KEYS[1], 'NX', us, ARGV[1])
redis.call('ZADD', KEYS[2], nowms + tonumber(ARGV[2]), ARGV[1])
return redis.call('ZSCORE', KEYS[1], ARGV[1])
`)

// unwaitScript takes a request off its model's waiting list and wakes the
// replicas, whose requests may now be the oldest. KEYS: 1 waiting list,
// 2 waiter expiry. ARGV: 1 member, 2 wake-up channel, 3 the model.
var unwaitScript = redis.NewScript(`
local n = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if n > 0 then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return n
`)

// countScript reaps expired leases and returns the in-flight count of each
// worker. KEYS: 1 leases, 2 in-flight counts. ARGV: the workers.
var countScript = redis.NewScript(prelude + `
reap(KEYS[1], KEYS[2])
local c = redis.call('HMGET', KEYS[2], unpack(ARGV))
local out = {}
for i = 1, #ARGV do out[i] = math.max(0, tonumber(c[i]) or 0) end
return out
`)

// packCandidates appends to buf the candidates as the pick script reads
// them (ARGV 5): a MessagePack array of the names, then one of score,
// active weight and limit of each, all three as float64 so the script
// compares exactly the numbers the replica computed.
func packCandidates(buf []byte, cands []Candidate) []byte {
	buf = packArray(buf, len(cands))
	for _, c := range cands {
		buf = packString(buf, c.Worker)
	}
	buf = packArray(buf, 3*len(cands))
	for _, c := range cands {
		buf = packFloat(buf, c.Score)
		buf = packFloat(buf, c.ActiveWeight)
		buf = packFloat(buf, float64(c.Limit))
	}
	return buf
}

// packedSize bounds the length of packCandidates' output: every header at
// its longest.
func packedSize(cands []Candidate) int {
	n := 2*5 + 3*9*len(cands)
	for _, c := range cands {
		n += 5 + len(c.Worker)
	}
	return n
}

func packArray(buf []byte, n int) []byte {
	switch {
	case n < 16:
		return append(buf, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(buf, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(buf, 0xdd), uint32(n))
}

// packString uses fixstr, str 16 or str 32; not str 8, which older
// MessagePack decoders lack.
func packString(buf []byte, s string) []byte {
	switch {
	case len(s) < 32:
		buf = append(buf, 0xa0|byte(len(s)))
	case len(s) <= math.MaxUint16:
		buf = binary.BigEndian.AppendUint16(append(buf, 0xda), uint16(len(s)))
	default:
		buf = binary.BigEndian.AppendUint32(append(buf, 0xdb), uint32(len(s)))
	}
	return append(buf, s...)
}

func packFloat(buf []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(buf, 0xcb), math.Float64bits(f))
}

// reconcileScript removes this replica's leases and waiters that it no
// longer holds (see Ledger.reconcile). KEYS: 1 leases, 2 in-flight counts,
// then the waiting list and waiter-expiry ZSET of each model the replica
// has queued for. ARGV: 1 its lease-id prefix ("replica/"), 2 its member
// prefix ("replica|"), 3 the last lease number it issued, 4 the wake-up
// channel, then the lease ids and members it holds. A lease is removed
// only if numbered up to ARGV[3]. Returns how many it removed; wakes the
// replicas if any.
var reconcileScript = redis.NewScript(`
local lp, wp, last = ARGV[1], ARGV[2], tonumber(ARGV[3])
local keep = {}
for i = 5, #ARGV do keep[ARGV[i]] = true end
local removed = 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local slash = string.find(m, '/', 1, true)
  local lease = string.sub(m, slash + 1)
  if string.sub(lease, 1, #lp) == lp and not keep[lease] then
    local n = tonumber(string.sub(lease, #lp + 1))
    if n and n <= last then
      local w = string.sub(m, 1, slash - 1)
      redis.call('ZREM', KEYS[1], m)
      if redis.call('HINCRBY', KEYS[2], w, -1) <= 0 then redis.call('HDEL', KEYS[2], w) end
      removed = removed + 1
    end
  end
end
for i = 3, #KEYS, 2 do
  for _, m in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do
    if string.sub(m, 1, #wp) == wp and not keep[m] then
      redis.call('ZREM', KEYS[i], m)
      redis.call('ZREM', KEYS[i + 1], m)
      removed = removed + 1
    end
  end
end
if removed > 0 then redis.call('PUBLISH', ARGV[4], '') end
return removed
`)
