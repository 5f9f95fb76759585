package shared

import "github.com/redis/go-redis/v9"

// The Lua scripts. Each reads the server's clock (TIME), so expiry does not
// depend on the replicas' clocks agreeing, and counts only what has not
// expired. Redis runs a script to completion before any other
// command, so what a script reads is what it writes against.

// pickScript picks and reserves one worker.
//
// KEYS: 1 pick sequence (string), 2 last-pick hash (worker -> sequence),
// 3 waiting list of the model (ZSET member -> enqueue µs), 4 waiter expiry
// (ZSET member -> expiry ms), then one lease ZSET per candidate (lease id ->
// expiry ms).
// ARGV: 1 lease id, 2 lease TTL ms, 3 waiter member ("" for a request that
// never queued), 4 this replica's member prefix ("replica|"), then per
// candidate: name, score without the active term, active weight, limit.
//
// Returns {"ok", index (1-based), actives...}, {"full", actives...} or
// {"turn", older member}. actives are the shared in-flight counts before
// the pick, in candidate order.
var pickScript = redis.NewScript(`
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', nowms)
if #dead > 0 then
  redis.call('ZREM', KEYS[3], unpack(dead))
  redis.call('ZREM', KEYS[4], unpack(dead))
end
local me, mine = ARGV[3], ARGV[4]
local myscore = math.huge
if me ~= '' then
  local s = redis.call('ZSCORE', KEYS[3], me)
  if s then myscore = tonumber(s) end
end
local upto = '+inf'
if myscore ~= math.huge then upto = '(' .. string.format('%.17g', myscore) end
local older = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', upto, 'LIMIT', 0, 64)
for _, m in ipairs(older) do
  if string.sub(m, 1, #mine) ~= mine then
    return {'turn', m}
  end
end
local n = (#ARGV - 4) / 4
local names = {}
for i = 1, n do names[i] = ARGV[4 + 4 * (i - 1) + 1] end
local lasts = redis.call('HMGET', KEYS[2], unpack(names))
local actives = {}
local best, bestTotal, bestLast = 0, 0, 0
local live = '(' .. nowms
for i = 1, n do
  -- Live leases only: expired ones are not counted (and are removed
  -- below from the chosen worker, and by every count and renewal).
  local active = redis.call('ZCOUNT', KEYS[4 + i], live, '+inf')
  actives[i] = active
  local b = 4 + 4 * (i - 1)
  if active < tonumber(ARGV[b + 4]) then
    local total = tonumber(ARGV[b + 2]) + tonumber(ARGV[b + 3]) * active
    local last = tonumber(lasts[i]) or 0
    if best == 0 or total < bestTotal or (total == bestTotal and last < bestLast) then
      best, bestTotal, bestLast = i, total, last
    end
  end
end
if best == 0 then
  table.insert(actives, 1, 'full')
  return actives
end
redis.call('ZREMRANGEBYSCORE', KEYS[4 + best], '-inf', nowms)
local seq = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[4 + 4 * (best - 1) + 1], seq)
redis.call('ZADD', KEYS[4 + best], nowms + tonumber(ARGV[2]), ARGV[1])
if me ~= '' then
  redis.call('ZREM', KEYS[3], me)
  redis.call('ZREM', KEYS[4], me)
end
table.insert(actives, 1, best)
table.insert(actives, 1, 'ok')
return actives
`)

// releaseScript removes a lease and, if it was there, tells every replica
// a slot freed. KEYS: 1 the worker's lease ZSET. ARGV: 1 lease id, 2 the
// wake-up channel, 3 the worker's name.
var releaseScript = redis.NewScript(`
local n = redis.call('ZREM', KEYS[1], ARGV[1])
if n > 0 then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return n
`)

// renewScript extends (or re-creates, after Redis lost them) a replica's
// leases and waiters. KEYS: the lease ZSET of each lease, then the waiting
// list and waiter-expiry ZSET of each waiter. ARGV: 1 TTL ms, 2 number of
// leases, then the lease ids, then per waiter its member and enqueue µs.
// Returns how many leases and waiters were missing and are now back.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local exp = nowms + tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local missing = 0
for i = 1, n do
  missing = missing + redis.call('ZADD', KEYS[i], exp, ARGV[2 + i])
end
local w = 1
for i = n + 1, #KEYS, 2 do
  local m = ARGV[2 + n + w]
  missing = missing + redis.call('ZADD', KEYS[i], 'NX', ARGV[2 + n + w + 1], m)
  redis.call('ZADD', KEYS[i + 1], exp, m)
  w = w + 2
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
return tostring(redis.call('ZSCORE', KEYS[1], ARGV[1]))
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
// worker. KEYS: the workers' lease ZSETs.
var countScript = redis.NewScript(`
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', nowms)
  out[i] = redis.call('ZCARD', KEYS[i])
end
return out
`)
