package stats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-router/sluice/internal/redisconn"
)

// RedisStore keeps every worker's averages in Redis, shared by all the
// replicas pointing at it and independent of any one replica's life.
//
// Each worker is one hash (prefix + "stats:w:" + name) with a field per
// average and its sample count, read by name (Load); a set (prefix +
// "stats:workers") lists every worker ever stored, for an operator who
// wants to see or prune them. Observations are folded in by a Lua script (Fold): Redis runs a
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

// foldScript folds observations into one worker's hash as Tracker.fold
// does, with EMA.Add's arithmetic. KEYS: the worker's hash, the worker
// set. ARGV: worker name, alpha, updated (unix µs), then per observation
// five values: TTFT ms, E2E ms, output tokens, decode tokens/s (0: not
// measured) and the concurrency level (0: unknown). Each average is read
// once, when first folded into, and all are written back at the end. It
// returns the whole hash (HGETALL), its floats formatted to round-trip a
// float64 exactly.
var foldScript = redis.NewScript(`
local alpha, now = tonumber(ARGV[2]), tonumber(ARGV[3])
local avg, set = {}, {}
local function add(field, x)
  local e = avg[field]
  if not e then
    local c = redis.call('HMGET', KEYS[1], field, field .. '_n')
    e = {tonumber(c[1]) or 0, tonumber(c[2]) or 0}
    avg[field] = e
  end
  if e[2] == 0 then e[1] = x else e[1] = e[1] + alpha * (x - e[1]) end
  e[2] = e[2] + 1
end
for j = 4, #ARGV, 5 do
  local ttft, e2e, out, tps = tonumber(ARGV[j]), tonumber(ARGV[j+1]), tonumber(ARGV[j+2]), tonumber(ARGV[j+3])
  local k = tonumber(ARGV[j+4])
  if ttft > 0 then add('ttft_ms', ttft) end
  if e2e > 0 then add('e2e_ms', e2e) end
  if out > 0 then add('output_tokens', out) end
  if tps > 0 then add('decode_tps', tps) end
  if k > 0 and (tps > 0 or ttft > 0) then
    local p = 'l' .. string.format('%d', k) .. '.'
    if tps > 0 then
      add(p .. 'tps', tps)
      add(p .. 'sq', tps * tps)
    end
    if ttft > 0 then add(p .. 'ttft', ttft) end
    set[p .. 'upd_us'] = ARGV[3]
  end
end
for field, e in pairs(avg) do
  set[field] = string.format('%.17g', e[1])
  set[field .. '_n'] = string.format('%d', e[2])
end
local upd = tonumber(redis.call('HGET', KEYS[1], 'updated_us')) or 0
set['updated_us'] = string.format('%d', math.max(upd, now))
local args = {}
for field, v in pairs(set) do
  table.insert(args, field)
  table.insert(args, v)
end
redis.call('HSET', KEYS[1], unpack(args))
redis.call('SADD', KEYS[2], ARGV[1])
return redis.call('HGETALL', KEYS[1])
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
		args := make([]any, 0, 3+5*len(b.Obs))
		args = append(args, name, fmtFloat(alpha), strconv.FormatInt(b.Updated.UnixMicro(), 10))
		for _, o := range b.Obs {
			args = append(args, fmtFloat(ms(o.TTFT)), fmtFloat(ms(o.E2E)),
				strconv.Itoa(o.OutputTokens), fmtFloat(o.DecodeTPS), strconv.Itoa(LevelOf(o.Concurrency)))
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
			ws, err = decodeHash(pairs(vals))
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

// Load returns the named workers' shared averages, in one round trip.
func (s *RedisStore) Load(ctx context.Context, workers []string) (map[string]WorkerStats, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(workers))
	for i, name := range workers {
		cmds[i] = pipe.HGetAll(ctx, s.workerKey(name))
	}
	if len(workers) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("stats store %s: read workers: %w", s.desc, err)
		}
	}
	out := make(map[string]WorkerStats, len(workers))
	for i, c := range cmds {
		if len(c.Val()) == 0 {
			continue // nothing stored
		}
		ws, err := decodeHash(c.Val())
		if err != nil {
			return nil, fmt.Errorf("stats store %s: worker %q: %w", s.desc, workers[i], err)
		}
		out[workers[i]] = ws
	}
	return out, nil
}

// SaveFits writes each worker's fit, as JSON in its hash's "fit" field,
// replacing the stored one: fits are not folded, the last replica to
// flush wins.
func (s *RedisStore) SaveFits(ctx context.Context, fits map[string]*Fit) error {
	pipe := s.rdb.TxPipeline()
	for name, f := range fits {
		b, err := json.Marshal(f)
		if err != nil {
			return fmt.Errorf("stats store %s: fit of %q: %w", s.desc, name, err)
		}
		pipe.HSet(ctx, s.workerKey(name), "fit", string(b))
		pipe.SAdd(ctx, s.setKey(), name)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("stats store %s: save fits: %w", s.desc, err)
	}
	return nil
}

// Close closes the connection pool.
func (s *RedisStore) Close() error { return s.rdb.Close() }

func fromMicro(us int64) time.Time {
	if us <= 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}

// pairs turns HGETALL's flat reply into a map.
func pairs(flat []string) map[string]string {
	m := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		m[flat[i]] = flat[i+1]
	}
	return m
}

// decodeHash reads a worker's hash; absent fields are zero. An average
// is its value and sample count under its name and its name + "_n"
// ("ttft_ms", "ttft_ms_n", ...); "updated_us" is in unix µs, "fit" the
// fit as JSON, and concurrency level k has "l<k>.tps", "l<k>.sq" and
// "l<k>.ttft" with their counts, and "l<k>.upd_us".
func decodeHash(h map[string]string) (WorkerStats, error) {
	var firstErr error
	note := func(key string, err error) {
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("%s: %w", key, err)
		}
	}
	num := func(key string) float64 {
		if h[key] == "" {
			return 0
		}
		v, err := strconv.ParseFloat(h[key], 64)
		note(key, err)
		return v
	}
	cnt := func(key string) int64 {
		if h[key] == "" {
			return 0
		}
		v, err := strconv.ParseInt(h[key], 10, 64)
		note(key, err)
		return v
	}
	ema := func(key string) EMA { return EMA{Value: num(key), N: cnt(key + "_n")} }
	ws := WorkerStats{
		TTFTMs: ema("ttft_ms"), E2EMs: ema("e2e_ms"), OutputTokens: ema("output_tokens"), DecodeTPS: ema("decode_tps"),
		Updated: fromMicro(cnt("updated_us")),
	}
	if v := h["fit"]; v != "" {
		// A fit that does not decode (another version's) is dropped, not
		// an error: the predictor starts afresh, the averages stay.
		var f Fit
		if json.Unmarshal([]byte(v), &f) == nil {
			ws.Fit = &f
		}
	}
	top := 0
	for key := range h {
		if rest, ok := strings.CutPrefix(key, "l"); ok {
			if ks, _, ok := strings.Cut(rest, "."); ok {
				if k, err := strconv.Atoi(ks); err == nil && k > top && k <= MaxLevels {
					top = k
				}
			}
		}
	}
	if top > 0 {
		ls := make([]Level, top)
		for k := 1; k <= top; k++ {
			p := "l" + strconv.Itoa(k) + "."
			ls[k-1] = Level{DecodeTPS: ema(p + "tps"), DecodeSq: ema(p + "sq"), TTFTMs: ema(p + "ttft"), Updated: fromMicro(cnt(p + "upd_us"))}
		}
		ws.Levels = NewLevels(ls...)
	}
	return ws, firstErr
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
