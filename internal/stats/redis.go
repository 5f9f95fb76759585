package stats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-router/sluice/internal/redisconn"
)

// RedisStore keeps every worker's averages in Redis, shared by all the
// replicas pointing at it and independent of any one replica's life.
//
// Each worker is one hash (prefix + "stats:w:" + name) with a field per
// average and its sample count; a set (prefix + "stats:workers") lists the
// workers. Observations are folded in by a Lua script (Fold): Redis runs a
// script atomically, so two replicas folding into the same worker at once
// both land, in some order, and no sample is lost the way a client-side
// read-modify-write would lose one. RedisStore is a Folder, so the Tracker
// sends it observations rather than finished averages.
//
// Keys are those of one Redis (or one Redis Cluster hash slot per worker:
// the script touches the worker's hash and the worker set, so in a cluster
// give the prefix a hash tag such as "{sluice}:").
type RedisStore struct {
	rdb    *redis.Client
	prefix string
	desc   string
}

// OpenRedis returns a store on the Redis that url names (redis:// or
// rediss://, see package redisconn); prefix, when set, overrides the URL's.
// It fails only on a bad URL: a Redis that is down now is reported by the
// Tracker's first Load, and the router runs on local averages until it
// answers.
func OpenRedis(url, prefix string) (*RedisStore, error) {
	rdb, p, err := redisconn.Open(url, prefix)
	if err != nil {
		return nil, fmt.Errorf("stats store: %w", err)
	}
	return &RedisStore{rdb: rdb, prefix: p, desc: redisconn.Redact(url)}, nil
}

func (s *RedisStore) workerKey(name string) string { return s.prefix + "stats:w:" + name }
func (s *RedisStore) setKey() string               { return s.prefix + "stats:workers" }

// The hash fields, in the order the fold script reads and returns them.
var redisFields = []string{
	"ttft_ms", "ttft_ms_n", "e2e_ms", "e2e_ms_n",
	"output_tokens", "output_tokens_n", "decode_tps", "decode_tps_n", "updated_us",
}

// foldScript folds observations into one worker's hash with EMA.Add's
// arithmetic. KEYS: the worker's hash, the worker set. ARGV: worker name,
// alpha, updated (unix µs), then per observation four samples in the order
// TTFT ms, E2E ms, output tokens, decode tokens/s (0: not measured). It
// returns the new fields, in redisFields order, as strings that round-trip
// a float64 exactly.
var foldScript = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'ttft_ms', 'ttft_ms_n', 'e2e_ms', 'e2e_ms_n',
  'output_tokens', 'output_tokens_n', 'decode_tps', 'decode_tps_n', 'updated_us')
local v, n = {}, {}
for i = 1, 4 do
  v[i] = tonumber(cur[2*i-1]) or 0
  n[i] = tonumber(cur[2*i]) or 0
end
local alpha = tonumber(ARGV[2])
for j = 4, #ARGV, 4 do
  for i = 1, 4 do
    local x = tonumber(ARGV[j+i-1])
    if x > 0 then
      if n[i] == 0 then v[i] = x else v[i] = v[i] + alpha * (x - v[i]) end
      n[i] = n[i] + 1
    end
  end
end
local upd = tonumber(cur[9]) or 0
local now = tonumber(ARGV[3])
if now > upd then upd = now end
local names = {'ttft_ms', 'e2e_ms', 'output_tokens', 'decode_tps'}
local hset, out = {}, {}
for i = 1, 4 do
  local fv, fn = string.format('%.17g', v[i]), string.format('%d', n[i])
  table.insert(hset, names[i]); table.insert(hset, fv)
  table.insert(hset, names[i] .. '_n'); table.insert(hset, fn)
  table.insert(out, fv); table.insert(out, fn)
end
local fu = string.format('%d', upd)
table.insert(hset, 'updated_us'); table.insert(hset, fu)
table.insert(out, fu)
redis.call('HSET', KEYS[1], unpack(hset))
redis.call('SADD', KEYS[2], ARGV[1])
return out
`)

// Fold folds each worker's observations into its shared averages, one
// atomic script per worker, all in one round trip, and returns the
// resulting averages of the workers whose fold succeeded. A worker missing
// from the result was not folded (the error says why) and its observations
// should be sent again.
func (s *RedisStore) Fold(ctx context.Context, alpha float64, batch map[string]FoldBatch) (map[string]WorkerStats, error) {
	if len(batch) == 0 {
		return map[string]WorkerStats{}, nil
	}
	// Load the script once so the pipeline can use EVALSHA; a restarted
	// Redis forgets it, hence the check on every flush (one round trip).
	if err := foldScript.Load(ctx, s.rdb).Err(); err != nil {
		return nil, fmt.Errorf("stats store %s: load fold script: %w", s.desc, err)
	}
	names := make([]string, 0, len(batch))
	cmds := make([]*redis.Cmd, 0, len(batch))
	pipe := s.rdb.Pipeline()
	for name, b := range batch {
		args := make([]any, 0, 3+4*len(b.Obs))
		args = append(args, name, fmtFloat(alpha), strconv.FormatInt(b.Updated.UnixMicro(), 10))
		for _, o := range b.Obs {
			args = append(args, fmtFloat(ms(o.TTFT)), fmtFloat(ms(o.E2E)),
				strconv.Itoa(o.OutputTokens), fmtFloat(o.DecodeTPS))
		}
		names = append(names, name)
		cmds = append(cmds, foldScript.EvalSha(ctx, pipe, []string{s.workerKey(name), s.setKey()}, args...))
	}
	_, _ = pipe.Exec(ctx) // errors are per command, below
	out := make(map[string]WorkerStats, len(names))
	var errs []error
	for i, c := range cmds {
		vals, err := c.StringSlice()
		if err == nil {
			var ws WorkerStats
			ws, err = decodeFields(vals)
			if err == nil {
				out[names[i]] = ws
				continue
			}
		}
		errs = append(errs, fmt.Errorf("worker %q: %w", names[i], err))
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("stats store %s: fold: %w", s.desc, err)
	}
	return out, nil
}

// Load returns every worker's shared averages.
func (s *RedisStore) Load(ctx context.Context) (map[string]WorkerStats, error) {
	names, err := s.rdb.SMembers(ctx, s.setKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("stats store %s: list workers: %w", s.desc, err)
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(names))
	for i, name := range names {
		cmds[i] = pipe.HMGet(ctx, s.workerKey(name), redisFields...)
	}
	if len(names) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("stats store %s: read workers: %w", s.desc, err)
		}
	}
	out := make(map[string]WorkerStats, len(names))
	for i, c := range cmds {
		raw := c.Val()
		vals := make([]string, len(raw))
		for j, v := range raw {
			if str, ok := v.(string); ok {
				vals[j] = str
			}
		}
		ws, err := decodeFields(vals)
		if err != nil {
			return nil, fmt.Errorf("stats store %s: worker %q: %w", s.desc, names[i], err)
		}
		out[names[i]] = ws
	}
	return out, nil
}

// Save replaces the given workers' averages (each worker atomically). The
// Tracker folds rather than saves into a RedisStore; Save is for copying
// averages in from another store.
func (s *RedisStore) Save(ctx context.Context, entries map[string]WorkerStats) error {
	pipe := s.rdb.TxPipeline()
	for name, ws := range entries {
		pipe.HSet(ctx, s.workerKey(name), encodeFields(ws)...)
		pipe.SAdd(ctx, s.setKey(), name)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("stats store %s: save: %w", s.desc, err)
	}
	return nil
}

// Close closes the connection pool.
func (s *RedisStore) Close() error { return s.rdb.Close() }

func encodeFields(ws WorkerStats) []any {
	out := make([]any, 0, 2*len(redisFields))
	for i, e := range []EMA{ws.TTFTMs, ws.E2EMs, ws.OutputTokens, ws.DecodeTPS} {
		out = append(out, redisFields[2*i], fmtFloat(e.Value), redisFields[2*i+1], strconv.FormatInt(e.N, 10))
	}
	var us int64
	if !ws.Updated.IsZero() {
		us = ws.Updated.UnixMicro()
	}
	return append(out, redisFields[8], strconv.FormatInt(us, 10))
}

// decodeFields reads values in redisFields order; empty means absent.
func decodeFields(vals []string) (WorkerStats, error) {
	if len(vals) != len(redisFields) {
		return WorkerStats{}, fmt.Errorf("%d fields, want %d", len(vals), len(redisFields))
	}
	var emas [4]EMA
	for i := range emas {
		v, err := parseFloat(vals[2*i])
		if err != nil {
			return WorkerStats{}, fmt.Errorf("%s: %w", redisFields[2*i], err)
		}
		n, err := parseInt(vals[2*i+1])
		if err != nil {
			return WorkerStats{}, fmt.Errorf("%s: %w", redisFields[2*i+1], err)
		}
		emas[i] = EMA{Value: v, N: n}
	}
	us, err := parseInt(vals[8])
	if err != nil {
		return WorkerStats{}, fmt.Errorf("%s: %w", redisFields[8], err)
	}
	ws := WorkerStats{TTFTMs: emas[0], E2EMs: emas[1], OutputTokens: emas[2], DecodeTPS: emas[3]}
	if us > 0 {
		ws.Updated = time.UnixMicro(us).UTC()
	}
	return ws, nil
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func parseFloat(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	return strconv.ParseFloat(s, 64)
}

func parseInt(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	return strconv.ParseInt(s, 10, 64)
}
