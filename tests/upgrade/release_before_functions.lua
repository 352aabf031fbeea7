-- The decision script of the release before the Redis Function form: lua/lib.lua, the
-- algorithm files (token_bucket, gcra, fixed_window, sliding_window_counter,
-- sliding_window_log, concurrency) and decide.lua of that release, concatenated in that order,
-- byte for byte what its filter loaded with SCRIPT LOAD and called with EVALSHA (SHA-1
-- 568bf27f4dd216b9cf14d67b52517316a8f167eb, without this header). tests/tests/lua_upgrade.rs
-- strips this header (up to the first empty line), checks that SHA-1, and runs the script
-- beside this release's function on the same keys, as a fleet upgraded one replica at a time
-- does.

-- Shared part of the decision script. The filter sends ONE script to Redis: this file, then
-- one file per algorithm, then decide.lua, concatenated (see filter/core/src/lib.rs). Each
-- algorithm file adds a function to ALGORITHMS:
--
--   ALGORITHMS.name = function(key, p, now) -> d
--     key  the limit's state key
--     p    {limit = n, window = ms, burst = n, cost = n}; a fixed window's calendar window
--          has p.calendar = {unit = "D" | "W" | "M", offset = ms east of UTC} and no window
--     now  {str = Unix ns as a decimal string, ms = Unix ms as a number}
--     d    {allowed = bool, retry = ms until the request would be allowed (0 if allowed,
--           NEVER if it never can: its cost is above what the limit holds),
--           kept_remaining, kept_reset = remaining and ms until whole, if nothing is taken,
--           taken_remaining, taken_reset, commit = function writing the state: if allowed}
--
-- Reading and deciding are separate from writing (commit) so that a request is charged
-- to every limit or to none.
local ALGORITHMS = {}

-- DECIDE_ALONE.name = function(key, p, now) -> allowed, remaining, reset_ms, retry_ms: the
-- same decision for a request of that one limit, its state charged at once when it allows,
-- with no table made (decide.lua's fast path uses it where it exists). An algorithm gets both
-- from one decision function through `algorithm` below.
local DECIDE_ALONE = {}

-- Defines ALGORITHMS[name] and DECIDE_ALONE[name] from
--   decide(key, p, now) -> allowed, kept_remaining, kept_reset, retry, taken_remaining,
--     taken_reset, then up to four values for charge (when allowed)
--   charge(key, a1, a2, a3, a4) writing the state of an allowed decision.
local function algorithm(name, decide, charge)
  ALGORITHMS[name] = function(key, p, now)
    local allowed, kept, kept_reset, retry, taken, taken_reset, a1, a2, a3, a4 = decide(key, p, now)
    local d = {allowed = allowed, kept_remaining = kept, kept_reset = kept_reset, retry = retry,
      taken_remaining = taken, taken_reset = taken_reset}
    if allowed then
      d.commit = function()
        charge(key, a1, a2, a3, a4)
      end
    end
    return d
  end
  DECIDE_ALONE[name] = function(key, p, now)
    local allowed, kept, kept_reset, retry, taken, taken_reset, a1, a2, a3, a4 = decide(key, p, now)
    if allowed then
      charge(key, a1, a2, a3, a4)
      return true, taken, taken_reset, 0
    end
    return false, kept, kept_reset, retry
  end
end

-- Each algorithm file may also add REFUNDS.name = function(key, p, now): gives back what an
-- earlier charge took, for a request that another Redis Cluster slot refused (all or nothing
-- across slots). p has p.cost, p.charged_at (the charge's clock, Unix ns string), p.left (the
-- `remaining` that charge replied); now is the refund's clock, no earlier than any decision
-- on the key. A refund never gives back more than the charge still holds back: where other
-- decisions since make that uncertain it gives back less (a later false refusal, never an
-- overshoot).
local REFUNDS = {}

-- Algorithms whose units may be leased (mode "lease" in decide.lua): those whose reply's
-- reset_ms is the earliest the state can be whole again (bucket full, window over); the caller
-- spends a lease only until then (a unit spent later could be one the refill, or the next
-- window, would have brought anyway).
local LEASABLE = {}

-- Each algorithm usable for usage metering adds SETTLES.name = function(key, p, now): charges
-- p.delta units (a signed whole number) on the limit's state without refusing. Positive: the
-- units a response used above what was charged up front; the balance may go below zero (debt)
-- and the identity is refused until refill or the next windows repay it. Negative: units given
-- back, never past the full allowance. A state that expired is settled as a fresh one (full):
-- a charge takes from the whole allowance, a give-back has nothing to add to.
local SETTLES = {}

-- An algorithm's retry for a request whose cost is more than the limit ever holds (a
-- bucket's burst, a window's limit): no wait makes it fit. See decide.lua's reply.
local NEVER = -1

-- Is Unix-ns string a later than b? Equal-length digit strings compare like numbers.
local function later(a, b)
  if #a ~= #b then
    return #a > #b
  end
  return a > b
end

-- Exact milliseconds from ns string a to ns string b: ns timestamps (~1.8e18) do not fit a
-- double, so seconds and nanoseconds are subtracted separately.
-- The call's own clock is split once (set_clock): nearly every elapsed_ms has it on one side.
local clock_ts, clock_s, clock_ns
local function split(ts)
  if ts == clock_ts then
    return clock_s, clock_ns
  end
  if #ts <= 9 then
    return 0, tonumber(ts)
  end
  return tonumber(string.sub(ts, 1, -10)), tonumber(string.sub(ts, -9))
end

local function set_clock(ts)
  clock_ts = nil
  clock_s, clock_ns = split(ts)
  clock_ts = ts
end

local function elapsed_ms(a, b)
  local as, ans = split(a)
  local bs, bns = split(b)
  return (bs - as) * 1000 + (bns - ans) / 1e6
end
-- Token bucket: `burst` tokens at most, refilled continuously at `limit` per `window`.
-- Smooth: a client that waits gets tokens back gradually; a full bucket allows a burst.
--
-- State (a hash at the limit's key):
--   tokens  tokens left after the last decision (%.17g: the stored float is exact)
--   ts      Unix ns of the last decision, stored exactly as given, never moved back
-- Memory: one small hash per key. Expires once the bucket would be full again, + 60 s.
algorithm('token_bucket', function(key, p, now)
  local rate = p.limit / p.window -- tokens per ms
  local capacity = p.burst
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1])
  local stamp = now.str
  if tokens == nil or not state[2] then
    tokens = capacity
  elseif later(now.str, state[2]) then
    tokens = math.min(capacity, tokens + elapsed_ms(state[2], now.str) * rate)
  else
    -- A clock that went backwards refills nothing, and the stored time stays, or the same
    -- interval would be credited twice once the clock catches up.
    stamp = state[2]
    tokens = math.min(capacity, tokens)
  end
  -- Refill starts at the stored time: waits count from there when this clock is behind it.
  local ahead = stamp == now.str and 0 or elapsed_ms(now.str, stamp)
  local kept_reset = ahead + (capacity - tokens) / rate
  if tokens >= p.cost then
    local left = tokens - p.cost
    return true, tokens, kept_reset, 0, left, ahead + (capacity - left) / rate,
      left, stamp, math.ceil(ahead + capacity / rate) + 60000
  elseif p.cost > capacity then
    return false, tokens, kept_reset, NEVER
  end
  return false, tokens, kept_reset, math.ceil(ahead + (p.cost - tokens) / rate)
end, function(key, left, stamp, ttl)
  redis.call('HSET', key, 'tokens', string.format('%.17g', left), 'ts', stamp)
  redis.call('PEXPIRE', key, ttl)
end)

-- Gives back at most the cost, less what the bucket may have refilled past its capacity since
-- the charge (then the charge no longer holds anything back): at the charge the bucket held
-- `left`; by the latest decision t it holds at most left + rate × (t - charge), so the charge
-- holds back at least min(cost, capacity - that).
REFUNDS.token_bucket = function(key, p, now)
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1])
  if tokens == nil or not state[2] then
    return -- expired: the bucket is full anyway
  end
  local rate = p.limit / p.window
  local latest = later(state[2], now.str) and state[2] or now.str
  local most = p.left + math.max(0, elapsed_ms(p.charged_at, latest)) * rate
  local back = math.min(p.cost, p.burst - most)
  if back > 0 then
    redis.call('HSET', key, 'tokens', string.format('%.17g', math.min(p.burst, tokens + back)))
  end
end

-- Tokens may go below zero (debt): the refill repays it before the next request fits.
SETTLES.token_bucket = function(key, p, now)
  local rate = p.limit / p.window
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1])
  local stamp = now.str
  if tokens == nil or not state[2] then
    if p.delta <= 0 then
      return -- a fresh bucket is full
    end
    tokens = p.burst
  elseif later(now.str, state[2]) then
    tokens = math.min(p.burst, tokens + elapsed_ms(state[2], now.str) * rate)
  else
    stamp = state[2]
    tokens = math.min(p.burst, tokens)
  end
  local left = math.min(p.burst, tokens - p.delta)
  local ahead = stamp == now.str and 0 or elapsed_ms(now.str, stamp)
  redis.call('HSET', key, 'tokens', string.format('%.17g', left), 'ts', stamp)
  redis.call('PEXPIRE', key, math.ceil(ahead + (p.burst - left) / rate) + 60000)
end

LEASABLE.token_bucket = true
-- GCRA (generic cell rate algorithm): the token bucket's behaviour from one number, the
-- "theoretical arrival time" (TAT) of the next request. One request is due every
-- T = window / limit; a request may come up to `burst` intervals early.
--
-- State (a hash at the limit's key):
--   tat  theoretical arrival time, Unix ms (%.17g)
-- Memory: one number per key. Expires when TAT has passed (the key would be fresh), + 60 s.
algorithm('gcra', function(key, p, now)
  local interval = p.window / p.limit
  local stored = tonumber(redis.call('HGET', key, 'tat'))
  -- A clock that went backwards cannot move TAT back.
  local tat = math.max(stored or now.ms, now.ms)
  local new_tat = tat + p.cost * interval
  local allow_at = new_tat - p.burst * interval
  local kept = math.max(0, (now.ms - (tat - p.burst * interval)) / interval)
  if now.ms >= allow_at then
    return true, kept, tat - now.ms, 0, math.max(0, (now.ms - allow_at) / interval),
      new_tat - now.ms, new_tat, math.ceil(new_tat - now.ms) + 60000
  elseif p.cost > p.burst then
    return false, kept, tat - now.ms, NEVER -- even at TAT = now, more than burst intervals early
  end
  return false, kept, tat - now.ms, math.ceil(allow_at - now.ms)
end, function(key, new_tat, ttl)
  redis.call('HSET', key, 'tat', string.format('%.17g', new_tat))
  redis.call('PEXPIRE', key, ttl)
end)

-- Moves TAT back by at most cost intervals, less the time the clock may have passed the TAT
-- this limit would have had without the charge (there the charge stopped holding anything
-- back). now is the refund's clock plus the allowed clock skew: no replica decided later.
REFUNDS.gcra = function(key, p, now)
  local stored = tonumber(redis.call('HGET', key, 'tat'))
  if stored == nil then
    return
  end
  local interval = p.window / p.limit
  local charged_ms = elapsed_ms('0', p.charged_at)
  -- The TAT the charge wrote, from what it replied: left = (charge - (tat - burst × T)) / T.
  local without = charged_ms + (p.burst - p.left) * interval - p.cost * interval
  local back = p.cost * interval - math.max(0, now.ms - without)
  if back > 0 then
    redis.call('HSET', key, 'tat', string.format('%.17g', stored - back))
  end
end

-- Debt moves TAT further ahead than burst intervals; a give-back moves it back, never before
-- now (a TAT in the past is a full allowance already).
SETTLES.gcra = function(key, p, now)
  local interval = p.window / p.limit
  local stored = tonumber(redis.call('HGET', key, 'tat'))
  if stored == nil and p.delta <= 0 then
    return
  end
  local tat = math.max(stored or now.ms, now.ms)
  local new_tat = math.max(now.ms, tat + p.delta * interval)
  redis.call('HSET', key, 'tat', string.format('%.17g', new_tat))
  redis.call('PEXPIRE', key, math.ceil(new_tat - now.ms) + 60000)
end

LEASABLE.gcra = true
-- Fixed window: at most `limit` per window. Windows of p.window ms are aligned to the Unix
-- epoch so every replica agrees on their edges; calendar windows (p.calendar: a day, an ISO
-- week from Monday or a month from the 1st, at a fixed UTC offset) to midnight at that offset.
-- Cheapest, but a client can send `limit` at the end of one window and `limit` again at the
-- start of the next: up to 2 x limit within one window length.
--
-- State (a hash at the limit's key):
--   w  index of the current window (floor(now / window); calendar: days since 1970-01-01,
--      weeks since Monday 1969-12-29, or 12 x year + month - 1)
--   n  cost counted in it; above `limit` only by debt (SETTLES), which each window that
--      starts repays by `limit`
-- Memory: two numbers per key. Expires at the window's end (past the debt's windows), + 60 s.

-- Calendar arithmetic on whole numbers (exact in doubles): civil dates from day numbers and
-- back, in the proleptic Gregorian calendar, with years counted from March (a leap day ends
-- its year) in eras of 400 years (146097 days). The Rust twin is ratelimit_core::calendar.
local DAY_MS = 86400000

-- Days from 1970-01-01 to the 1st of `month` (1 to 12) of `year`.
local function days_from_civil(year, month)
  if month <= 2 then
    year = year - 1
  end
  local era = math.floor(year / 400)
  local year_of_era = year - era * 400
  local day_of_year = math.floor((153 * ((month + 9) % 12) + 2) / 5)
  local day_of_era = year_of_era * 365 + math.floor(year_of_era / 4)
    - math.floor(year_of_era / 100) + day_of_year
  return era * 146097 + day_of_era - 719468
end

-- The year and month (1 to 12) of day `days` after 1970-01-01.
local function civil_from_days(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local from_march = math.floor((5 * doy + 2) / 153)
  local month = from_march < 10 and from_march + 3 or from_march - 9
  return yoe + era * 400 + (month <= 2 and 1 or 0), month
end

-- The index of the window holding Unix ms `ms`.
local function window_index(p, ms)
  local c = p.calendar
  if not c then
    return math.floor(ms / p.window)
  end
  local day = math.floor((ms + c.offset) / DAY_MS)
  if c.unit == 'D' then
    return day
  elseif c.unit == 'W' then
    -- Day 0 is a Thursday: day -3 is the Monday week 0 starts on.
    return math.floor((day + 3) / 7)
  end
  local year, month = civil_from_days(day)
  return 12 * year + month - 1
end

-- The Unix ms at which window `index` ends (and the next begins).
local function window_end(p, index)
  local c = p.calendar
  if not c then
    return (index + 1) * p.window
  end
  local following = index + 1
  local day
  if c.unit == 'D' then
    day = following
  elseif c.unit == 'W' then
    day = 7 * following - 3
  else
    local year = math.floor(following / 12)
    day = days_from_civil(year, following - 12 * year + 1)
  end
  return day * DAY_MS - c.offset
end

-- The window a decision at `index` counts in and its count: the newest window seen (a clock
-- that went backwards stays in it); a later window starts from what debt left over.
local function fixed_window_now(index, w, n, limit)
  if w == nil then
    return index, 0
  elseif index > w then
    return index, math.max(0, n - limit * (index - w))
  end
  return w, n
end

algorithm('fixed_window', function(key, p, now)
  local index = window_index(p, now.ms)
  local state = redis.call('HMGET', key, 'w', 'n')
  local w, n = tonumber(state[1]), tonumber(state[2]) or 0
  index, n = fixed_window_now(index, w, n, p.limit)
  local ends_at = window_end(p, index)
  local ends_in = math.max(0, ends_at - now.ms)
  -- The ms from this window's end to the end of the k-th window after it.
  local function beyond(k)
    return window_end(p, index + k) - ends_at
  end
  -- Windows after this one that debt still fills.
  local owed = math.max(0, math.ceil(n / p.limit) - 1)

  local kept = math.max(0, p.limit - n)
  local kept_reset = n > 0 and ends_in + beyond(owed) or 0
  if n + p.cost <= p.limit then
    return true, kept, kept_reset, 0, p.limit - n - p.cost, ends_in,
      index, n + p.cost, math.ceil(ends_in) + 60000
  elseif p.cost > p.limit then
    return false, kept, kept_reset, NEVER
  end
  -- Debt: each window that starts repays `limit`, until n + cost fits.
  local windows = math.max(1, math.ceil((n + p.cost - p.limit) / p.limit))
  return false, kept, kept_reset, math.ceil(ends_in + beyond(windows - 1))
end, function(key, index, n, ttl)
  redis.call('HSET', key, 'w', index, 'n', n)
  redis.call('PEXPIRE', key, ttl)
end)

-- Counts are additive: the charge's window, if it is still the current one, counts cost less.
REFUNDS.fixed_window = function(key, p, now)
  local state = redis.call('HMGET', key, 'w', 'n')
  local w, n = tonumber(state[1]), tonumber(state[2])
  if w ~= nil and n ~= nil and w == window_index(p, elapsed_ms('0', p.charged_at)) then
    redis.call('HSET', key, 'n', math.max(0, n - p.cost))
  end
end

SETTLES.fixed_window = function(key, p, now)
  local index = window_index(p, now.ms)
  local state = redis.call('HMGET', key, 'w', 'n')
  local w, n = tonumber(state[1]), tonumber(state[2]) or 0
  index, n = fixed_window_now(index, w, n, p.limit)
  if w == nil and p.delta <= 0 then
    return
  end
  n = math.max(0, n + p.delta)
  local ends_at = window_end(p, index)
  local ends_in = math.max(0, ends_at - now.ms)
  -- Kept until the last window the debt fills has ended.
  local owed_end = window_end(p, index + math.floor(n / p.limit))
  redis.call('HSET', key, 'w', index, 'n', n)
  redis.call('PEXPIRE', key, math.ceil(ends_in + (owed_end - ends_at)) + 60000)
end

LEASABLE.fixed_window = true
-- Sliding window counter: the fixed window's two counters (this window and the previous
-- one), with the previous one weighted by how much of it still overlaps the sliding window.
-- Nearly exact (it assumes the previous window's requests were spread evenly), no boundary
-- burst, constant memory.
--
-- State (a hash at the limit's key):
--   w     index of the current window
--   cur   cost counted in window w
--   prev  cost counted in window w - 1
-- Memory: three numbers per key. Expires when both windows are out of reach, + 60 s.
algorithm('sliding_window_counter', function(key, p, now)
  local W = p.window
  local index = math.floor(now.ms / W)
  local state = redis.call('HMGET', key, 'w', 'cur', 'prev')
  local w, cur, prev = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
  local into = now.ms - index * W
  if w == nil or index > w + 1 then
    cur, prev = 0, 0
  elseif index == w + 1 then
    cur, prev = 0, cur
  elseif index < w then
    index, into = w, 0 -- a clock that went backwards: the newest window, fully weighted
  end
  local weight = (W - into) / W
  local estimate = prev * weight + cur
  -- Time until the estimate drops to `target` or less, or nil if it never does on its own.
  local function wait_for(target)
    if estimate <= target then return 0 end
    if cur <= target and prev > 0 then
      -- Within this window: prev * (W - t) / W + cur <= target.
      return math.max(0, W - (target - cur) * W / prev - into)
    end
    if target < 0 then return nil end
    -- Next window: cur becomes prev and decays from the next window's start.
    return (W - into) + math.max(0, W - target * W / cur)
  end

  local kept = math.max(0, p.limit - estimate)
  if estimate + p.cost <= p.limit then
    return true, kept, wait_for(0), 0, math.max(0, p.limit - estimate - p.cost), (W - into) + W,
      index, cur + p.cost, prev, math.ceil(2 * W - into) + 60000
  elseif p.cost > p.limit then
    return false, kept, wait_for(0), NEVER
  end
  return false, kept, wait_for(0), math.ceil(wait_for(p.limit - p.cost) or (2 * W - into))
end, function(key, index, cur, prev, ttl)
  redis.call('HSET', key, 'w', index, 'cur', cur, 'prev', prev)
  redis.call('PEXPIRE', key, ttl)
end)

-- Counts are additive: the charge's window counts cost less, whether it is still the current
-- window or has become the previous one.
REFUNDS.sliding_window_counter = function(key, p, now)
  local state = redis.call('HMGET', key, 'w', 'cur', 'prev')
  local w, cur, prev = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
  local charged = math.floor(elapsed_ms('0', p.charged_at) / p.window)
  if w == charged then
    redis.call('HSET', key, 'cur', math.max(0, cur - p.cost))
  elseif w == charged + 1 then
    redis.call('HSET', key, 'prev', math.max(0, prev - p.cost))
  end
end

-- Debt counts in the current window like a charge: it weighs on the next window as the
-- previous one, and is forgotten once both windows have passed (at most two windows of debt).
-- A give-back takes from the current window's count first, then from the previous one's.
SETTLES.sliding_window_counter = function(key, p, now)
  local W = p.window
  local index = math.floor(now.ms / W)
  local state = redis.call('HMGET', key, 'w', 'cur', 'prev')
  local w, cur, prev = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
  if w == nil or index > w + 1 then
    if p.delta <= 0 then
      return
    end
    cur, prev = 0, 0
  elseif index == w + 1 then
    cur, prev = 0, cur
  elseif index < w then
    index = w
  end
  if p.delta >= 0 then
    cur = cur + p.delta
  else
    local back = -p.delta
    local from_cur = math.min(cur, back)
    cur, prev = cur - from_cur, math.max(0, prev - (back - from_cur))
  end
  local into = math.max(0, now.ms - index * W)
  redis.call('HSET', key, 'w', index, 'cur', cur, 'prev', prev)
  redis.call('PEXPIRE', key, math.ceil(2 * W - into) + 60000)
end
-- Sliding window log: the time of every counted request in a sorted set, so the count over
-- the last `window` is exact at every instant. Memory grows with the limit (one entry per
-- unit of cost in the window), so keep it for small limits: login attempts, SMS, payments.
--
-- State (a sorted set at the limit's key):
--   score   Unix ms of the request
--   member  "<now ns>:<redis time us>:<i>", unique even for equal client clocks
-- Memory: up to `limit` entries per key. Expires one window after the newest entry, + 60 s.
ALGORITHMS.sliding_window_log = function(key, p, now)
  -- Entries at or before now - window no longer count.
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.17g', now.ms - p.window))
  local count = redis.call('ZCARD', key)
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local kept_reset = 0
  if newest[2] then
    kept_reset = math.max(0, tonumber(newest[2]) + p.window - now.ms)
  end

  local d = {
    allowed = count + p.cost <= p.limit,
    kept_remaining = math.max(0, p.limit - count),
    kept_reset = kept_reset,
    retry = 0,
  }
  if d.allowed then
    d.taken_remaining = p.limit - count - p.cost
    d.taken_reset = p.window
    d.commit = function()
      local t = redis.call('TIME')
      local score = string.format('%.17g', now.ms)
      for i = 1, p.cost do
        redis.call('ZADD', key, score, now.str .. ':' .. t[1] .. t[2] .. ':' .. i)
      end
      redis.call('PEXPIRE', key, math.ceil(p.window) + 60000)
    end
  elseif p.cost > p.limit then
    d.retry = NEVER
  else
    -- The request fits once the (count + cost - limit) oldest entries have left the window.
    local k = count + p.cost - p.limit
    local entry = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
    d.retry = math.max(1, math.ceil(tonumber(entry[2]) + p.window - now.ms))
  end
  return d
end

-- Removes cost entries of the charge's instant: entries with one score are interchangeable
-- units (requests of one batch share the clock), so which of them go does not matter.
REFUNDS.sliding_window_log = function(key, p, now)
  local score = string.format('%.17g', elapsed_ms('0', p.charged_at))
  local entries = redis.call('ZRANGE', key, score, score, 'BYSCORE', 'LIMIT', 0, p.cost)
  if #entries > 0 then
    redis.call('ZREM', key, unpack(entries))
  end
end
-- Concurrency: at most `limit` requests of an identity in flight at once, across every
-- replica. Each admitted request holds a slot until its stream ends (the filter then sends a
-- release: mode "settle" with the request's id) or, when no release comes (a proxy that
-- died, a call lost in an outage), until its own deadline: `max_duration` (the window
-- argument) after it was admitted. No slot outlives its deadline.
--
-- State (a sorted set at the limit's key):
--   member  the request's id, p.member ("<worker>-<stream>", unique per proxy worker)
--   score   Unix ms at which its slot frees itself (admission + max_duration)
-- Memory: one entry per request in flight. Expires max_duration after the newest admission,
-- + 60 s. A request holds one slot whatever its cost.
ALGORITHMS.concurrency = function(key, p, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.17g', now.ms))
  local held = redis.call('ZCARD', key)
  local d = {
    allowed = held < p.limit,
    kept_remaining = math.max(0, p.limit - held),
    kept_reset = 0,
    retry = 0,
  }
  if d.allowed then
    d.taken_remaining = p.limit - held - 1
    d.taken_reset = 0
    d.commit = function()
      redis.call('ZADD', key, string.format('%.17g', now.ms + p.window), p.member)
      redis.call('PEXPIRE', key, math.ceil(p.window) + 60000)
    end
  else
    -- A slot frees whenever a request in flight ends, and at the latest at the oldest
    -- admission's deadline: retry within a second, or by then if sooner.
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    local latest = oldest[2] and math.max(1, math.ceil(tonumber(oldest[2]) - now.ms)) or 1
    d.kept_reset = latest
    d.retry = math.min(1000, latest)
  end
  return d
end

-- A release: the request's stream ended (or another slot refused it), its slot frees now.
SETTLES.concurrency = function(key, p, now)
  redis.call('ZREM', key, p.member)
end
-- Decides a batch of requests in one call: in arrival order, each all or nothing over its own
-- limits, exactly as if each had been sent alone (a request sees what the ones before it in the
-- batch charged). The argument layout is built in one place, ratelimit_core::bridge::DecideCall.
--
-- KEYS[k]    the distinct keys of the batch (state, key-budget counters, overflow state)
-- ARGV[1]    clock: Unix time in ns (decimal string) from the caller, or "redis" to use TIME
-- ARGV[2]    deadline: Unix ms after which the caller has given up (plus the clock skew it
--            allows), or "0" for none. A call that reaches Redis later is refused whole
--            ("EXPIRED ...") and charges nothing: its requests were already decided by policy.
-- ARGV[3]    number of requests R
-- ARGV[4]    number of key budgets B, then four per budget: counter key index, new keys per
--            window, window (ms), "shared" | "deny"
-- then the number of limit definitions D, then seven per definition: algorithm, limit,
--            window, burst, mode, budget index (0: none), overflow key index (0: none).
--            A batch's requests on one rule's limit share one definition.
--            The window is its length in ms (digits), or for fixed_window a calendar window:
--            "D", "W" or "M" (a day, an ISO week from Monday, a month from the 1st), then its
--            UTC offset in minutes, signed: "M+330" is a month at UTC+05:30, "D-300" a day at
--            UTC-05:00, "W+0" a week in UTC. Parsed only when it is not plain digits.
--            The mode is "enforce" | "shadow" (a budget only with these);
--            or, to give back what an earlier call charged (Redis Cluster: another slot
--            refused the request), "refund": the limit then adds the charge's clock (Unix ns)
--            and the remaining it replied. A refund request takes nothing and replies 1 for
--            each limit; its clock (ARGV[1]) must be no earlier than any decision on its keys.
--            or, to ask for a lease (token_bucket, gcra, fixed_window), "lease": the limit
--            adds its max units and fraction: see "Leases" below.
--            or, for a limit metered by usage in mode `after`, "after": allowed while at least
--            1 unit is left, charging nothing (cost is ignored).
--            or, to settle a usage limit (a charge of a signed number of units that never
--            refuses: positive is debt, negative gives back; see SETTLES in lib.lua),
--            "settle": the limit adds the delta and "0"; for a concurrency limit, a release
--            of the slot the request holds: "-1" and the request's id. A settle request takes
--            nothing and replies 1 for each limit, like a refund request; a request that
--            adjusts holds only refunds and settles, or none.
--            or, for a concurrency limit (always), "hold": the limit adds the request's id
--            (unique per request, the member its slot is held by).
-- then, per request: its number of limits n, then per limit: key index (into KEYS),
--            definition index, cost, then what its definition's mode adds (above).
--
-- Within a request, tokens are taken only if every enforced limit allows; then every limit
-- that allows is charged (a shadow limit that refuses is not). Returns
--   {R, then per request either
--      committed (1|0), n, then per limit: outcome, remaining, reset_ms, retry_ms
--    or -1, "ERR ..." when that request alone could not be decided (bad arguments, a Redis
--      error such as WRONGTYPE): the others are still decided}
-- with whole numbers as integers and the others as their text (Redis would truncate a Lua
-- number with a fraction). remaining and
-- reset_ms describe the state after this request: charged if committed, untouched if not.
-- retry_ms is 0 for a limit that allowed, else the ms until this request would fit, or -1
-- when it never can: its cost is more than the limit ever holds (a token_bucket's or gcra's
-- burst, a window's limit, the override's where one applies). No wait helps such a request,
-- so the caller sends no Retry-After for it.
-- outcome is 1 (allowed) or 0 (refused), plus 2 when the limit's identity was new while its
-- rule's key budget was used up: then the limit was decided on the rule's overflow state
-- ("shared") or refused until the budget's window ends ("deny"); plus 4 when an override
-- applied, 8 when the override found was malformed and ignored; plus 16 x the override's
-- quota (its burst for token_bucket and gcra, else its limit; 0 for "unlimited" and
-- "blocked"; see read_override below).
--
-- Overrides: a limit whose key index is "i:j" reads the identity's override at KEYS[j] before
-- it is decided (and before a refund or settlement: they use the numbers it was decided
-- with). "unlimited" allows and charges nothing, "blocked" refuses until the override's expiry
-- (retry 0 when it has none), "limit" replaces the limit and burst.
--
-- Leases: when every limit of a committed request is in mode "lease", the request also takes
-- k - 1 further requests' worth of units at once (all or nothing over its limits), which the
-- caller spends locally: k is the largest whole number with k x cost <= max units and
-- k x cost <= fraction x the units left before the request, on every limit (at least 1: the
-- request alone, which is how decisions near the limit stay exact). The committed flag is then
-- k instead of 1, and remaining / reset_ms describe the state after the whole lease.
--
-- Key budget: an identity is new when none of its keys under that budget exist. A new
-- identity charged by a committed request counts one against the budget's current window
-- (a fixed window: floor(now / window), or the counter's window if a call with a later clock
-- already moved it on); existing identities never touch the budget.
--
-- Redis Cluster, a call for several slots of one node: Redis refuses declared keys of several
-- slots (CROSSSLOT), so such a call declares none and ARGV starts with its keys: the first key
-- (the proxy routes the call by it), their number K, "1" to also reply this node's slot map
-- (else "0"), the other K - 1 keys; then the layout above. Redis checks each key as the
-- script touches it: one this node does not serve (another node's slot, or a key gone from a
-- slot being migrated) fails that request alone, at a read, before it wrote anything. The
-- map follows the requests in the reply: "slots", the number of ranges, then per range its
-- first slot, last slot and master (numbered in order of appearance).
-- A call that declares no key and starts with its clock ("redis" or digits: a key never is
-- either) is in the layout above: the breaker's probe, a batch of no request.
local KEYS, ARGV, SLOT_MAP = KEYS, ARGV, false
if #KEYS == 0 and #ARGV >= 3 and ARGV[1] ~= 'redis' and not string.match(ARGV[1], '^%d+$') then
  local count = tonumber(ARGV[2])
  if not count or count ~= math.floor(count) or count < 1 or count + 2 > #ARGV then
    return redis.error_reply('ERR decide: bad key count')
  end
  local keys, args = {ARGV[1]}, {}
  for i = 2, count do
    keys[i] = ARGV[i + 2]
  end
  for i = count + 3, #ARGV do
    args[#args + 1] = ARGV[i]
  end
  KEYS, ARGV, SLOT_MAP = keys, args, ARGV[3] == '1'
end

local redis_time = nil
local function time_now()
  redis_time = redis_time or redis.call('TIME')
  return redis_time
end

local deadline = ARGV[2]
if not deadline or not string.match(deadline, '^%d+$') then
  return redis.error_reply('ERR decide: deadline must be Unix ms digits or "0"')
end
if deadline ~= '0' then
  local t = time_now()
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(deadline) then
    return redis.error_reply('EXPIRED decide: the call reached Redis after its deadline')
  end
end

local now_str = ARGV[1]
if now_str == 'redis' then
  local t = time_now()
  now_str = t[1] .. string.format('%06d', tonumber(t[2])) .. '000'
end
if not string.match(now_str, '^%d+$') then
  return redis.error_reply('ERR decide: clock must be Unix ns digits or "redis"')
end
set_clock(now_str)
local now = {str = now_str}
now.ms = elapsed_ms('0', now_str)

-- A reply number: a whole one as an integer (no text to format), else its text (Redis would
-- truncate a Lua number with a fraction).
local function wire_number(x)
  if x == math.floor(x) then
    return x
  end
  return tostring(x)
end

local function whole(v)
  return v and v >= 0 and v == math.floor(v)
end

-- A calendar window argument ("M+330"): {unit = "D" | "W" | "M", offset = ms east of UTC},
-- or nil.
local function calendar_of(text)
  local unit, sign, minutes = string.match(text, '^([DWM])([+-])(%d+)$')
  minutes = tonumber(minutes)
  if not unit or minutes > 840 then
    return nil
  end
  return {unit = unit, offset = (sign == '-' and -minutes or minutes) * 60000}
end

local requests = tonumber(ARGV[3])
if not whole(requests) then
  return redis.error_reply('ERR decide: bad request count')
end

local BUDGETS = {}
local budget_count = tonumber(ARGV[4])
if not whole(budget_count) or 4 + 4 * budget_count > #ARGV then
  return redis.error_reply('ERR decide: bad key budget count')
end
for b = 1, budget_count do
  local at = 4 + (b - 1) * 4
  local budget = {
    key = KEYS[tonumber(ARGV[at + 1]) or 0],
    new_keys = tonumber(ARGV[at + 2]),
    window = tonumber(ARGV[at + 3]),
    deny = ARGV[at + 4] == 'deny',
  }
  if not budget.key or not whole(budget.new_keys) or budget.new_keys < 1
      or not budget.window or budget.window <= 0
      or (ARGV[at + 4] ~= 'deny' and ARGV[at + 4] ~= 'shared') then
    return redis.error_reply('ERR decide: bad arguments for key budget ' .. b)
  end
  BUDGETS[b] = budget
end

-- A request of one limit in mode "enforce" or "shadow", with no key budget or override, on an
-- algorithm whose window is its length in ms: the shape of nearly every decision. It is
-- decided without building the general path's tables (see fast_request below).
local FAST = {token_bucket = true, gcra = true, fixed_window = true,
  sliding_window_counter = true, sliding_window_log = true}

-- tonumber of an argument, remembered for the call: a batch repeats the same limit, window
-- and burst texts, and one table lookup costs far less than converting the text again.
local NUMBERS = {}
local function number_of(text)
  if text == nil then
    return nil
  end
  local n = NUMBERS[text]
  if n == nil then
    n = tonumber(text) or false
    NUMBERS[text] = n
  end
  return n or nil
end

-- The values a limit adds after its cost, by its definition's mode.
local EXTRAS = {enforce = 0, shadow = 0, after = 0, hold = 1, lease = 2, settle = 2, refund = 2}

-- The mode-specific fields of a limit in mode `mode`, from the values it adds (x, y); false
-- when they are malformed.
local function read_mode(p, mode, x, y)
  local name = p.algorithm_name
  local concurrency = name == 'concurrency'
  if mode == 'refund' then
    p.refund, p.charged_at, p.left = REFUNDS[name], x, tonumber(y)
    return p.refund and string.match(x, '^%d+$') and p.left and p.left >= 0 and not concurrency
  elseif mode == 'lease' then
    local lease = {max_units = tonumber(x), fraction = tonumber(y)}
    p.lease = lease
    return LEASABLE[name] and whole(lease.max_units) and lease.max_units >= 1
      and lease.fraction and lease.fraction > 0 and lease.fraction <= 1
  elseif mode == 'settle' then
    p.settle, p.delta = SETTLES[name], tonumber(x)
    if concurrency then
      p.member = y
    end
    return p.settle and p.delta and p.delta == math.floor(p.delta)
      and (not concurrency or y ~= '')
  elseif mode == 'hold' then
    p.member = x
    return x ~= ''
  end
  return true
end

-- Reads the D limit definitions at `a`: returns them and the position after them, or nil when
-- the layout is broken. A definition's fields are its limits' fields (its `meta` makes them
-- so); `ok` is false when they are malformed, and each limit using it is refused alone.
local function read_definitions(a)
  local count = tonumber(ARGV[a])
  if not whole(count) or a + 7 * count > #ARGV then
    return nil
  end
  local definitions = {}
  for d = 1, count do
    local at = a + (d - 1) * 7
    local name, mode = ARGV[at + 1], ARGV[at + 5]
    local window = tonumber(ARGV[at + 3])
    local def = {
      algorithm_name = name,
      algorithm = ALGORITHMS[name],
      limit = tonumber(ARGV[at + 2]),
      window = window,
      burst = tonumber(ARGV[at + 4]),
      mode = mode,
      extras = EXTRAS[mode],
    }
    -- A concurrency limit holds a slot or releases it, and only it holds one.
    local ok = def.extras ~= nil
    if name == 'concurrency' then
      ok = ok and (mode == 'hold' or mode == 'settle')
    else
      ok = ok and mode ~= 'hold' and (mode ~= 'after' or SETTLES[name] ~= nil)
    end
    local budget = tonumber(ARGV[at + 6])
    if budget ~= 0 then
      def.budget, def.overflow = budget, KEYS[tonumber(ARGV[at + 7]) or 0]
      ok = ok and (mode == 'enforce' or mode == 'shadow') and BUDGETS[budget] and def.overflow
    end
    local window_ok = window and window > 0
    if not window and name == 'fixed_window' then
      def.calendar = calendar_of(ARGV[at + 3])
      window_ok = def.calendar ~= nil
    end
    def.shadow, def.after = mode == 'shadow', mode == 'after'
    def.ok = ok and def.algorithm and def.limit and def.limit >= 1 and window_ok
      and def.burst and def.burst >= 1 and true or false
    def.meta = {__index = def}
    -- The one-limit requests decide_fast takes: no key budget, a window in ms.
    if def.ok and FAST[name] and (mode == 'enforce' or mode == 'shadow') and not def.budget
        and window then
      def.fast = {algorithm = def.algorithm, alone = DECIDE_ALONE[name], limit = def.limit,
        window = window, burst = def.burst}
    end
    definitions[d] = def
  end
  return definitions, a + 1 + 7 * count
end

-- Reads one request's limits from ARGV at `a`; returns the limits (or an error text) and
-- the position after them, or nil when the layout itself is broken.
local function read_request(a, definitions)
  local n = tonumber(ARGV[a])
  if not n or n < 1 or n ~= math.floor(n) or a + 3 * n > #ARGV then
    return nil
  end
  local limits, problem = {}, nil
  local b = a + 1
  for i = 1, n do
    local def = definitions[number_of(ARGV[b + 1]) or 0]
    if not def then
      return nil
    end
    if b + 2 + def.extras > #ARGV then
      return nil
    end
    -- "i", or "i:j" for a limit that reads its identity's override at KEYS[j].
    local key_index, override_index = number_of(ARGV[b]), nil
    if not key_index then
      key_index, override_index = string.match(ARGV[b], '^(%d+):(%d+)$')
      key_index = tonumber(key_index)
    end
    local p = setmetatable({key = KEYS[key_index or 0], cost = number_of(ARGV[b + 2])},
      def.meta)
    local ok = def.ok and read_mode(p, def.mode, ARGV[b + 3], ARGV[b + 4])
    if override_index then
      p.override = KEYS[tonumber(override_index)]
      ok = ok and p.override
    end
    if not (ok and p.key and p.cost and p.cost >= 0) then
      problem = problem or ('ERR decide: bad arguments for limit ' .. i)
    end
    limits[i] = p
    b = b + 3 + def.extras
  end
  return problem or limits, b
end

-- An override, as operators write it (ratelimit-admin): a hash with `mode` "limit" (then
-- `limit`, and `burst` for the algorithms that have one), "unlimited" or "blocked", and an
-- optional expiry `until` (Unix ms, on the decision's clock). The expiry is a field, not a
-- TTL, so that an eviction policy reaching only keys with a TTL (volatile-lru) never reaches an
-- override; an override past its `until` is absent, and gets a short TTL so it goes. (One
-- written with a TTL of its own instead still works: Redis removes it at its time.)
-- Reads it into p and returns the outcome bits it adds: 4 when it applies, 8 when it is
-- malformed (then the config's numbers apply).
local MAX_LIMIT = 1000000000000
local MAX_LOG_LIMIT = 10000
local MAX_STATE_LIFETIME_MS = 2 * 366 * 86400000
-- An expired override stays this long (ms) for operators to see it, then Redis removes it.
local EXPIRED_KEPT_MS = 60000
local HAS_BURST = {token_bucket = true, gcra = true}
local function read_override(p)
  local o = redis.pcall('HMGET', p.override, 'mode', 'limit', 'burst', 'until')
  if type(o) ~= 'table' or o.err then
    return 8
  end
  local mode = o[1]
  if not mode then
    return (o[2] or o[3] or o[4]) and 8 or 0
  end
  local function number(text)
    return text and string.match(text, '^[1-9]%d*$') and tonumber(text)
  end
  if o[4] then
    local expiry = number(o[4])
    if not expiry then
      return 8
    end
    if expiry <= now.ms then
      if redis.call('PTTL', p.override) == -1 then
        redis.call('PEXPIRE', p.override, EXPIRED_KEPT_MS)
      end
      return 0
    end
    p.override_until = expiry
  end
  if mode == 'unlimited' or mode == 'blocked' then
    if o[2] or o[3] then
      return 8
    end
    p[mode] = true
    return 4
  end
  local limit, burst = number(o[2]), o[3] and number(o[3])
  if mode ~= 'limit' or not limit or limit > MAX_LIMIT
      or (p.algorithm_name == 'sliding_window_log' and limit > MAX_LOG_LIMIT)
      or (o[3] and (not burst or burst > MAX_LIMIT or not HAS_BURST[p.algorithm_name])) then
    return 8
  end
  burst = burst or limit
  -- A calendar window is a month at most.
  if burst / limit * (p.window or 31 * 86400000) > MAX_STATE_LIFETIME_MS then
    return 8
  end
  p.limit, p.burst = limit, burst
  p.override_quota = HAS_BURST[p.algorithm_name] and burst or limit
  return 4
end

-- A blocked identity is refused until its override expires; one without expiry has no time
-- to wait for (retry 0: the caller sends no Retry-After).
local function blocked_decision(p)
  local wait
  if p.override_until then
    wait = math.ceil(p.override_until - now.ms)
  else
    local ttl = redis.call('PTTL', p.override)
    wait = ttl > 0 and ttl or 0
  end
  return {allowed = false, kept_remaining = 0, kept_reset = wait, retry = wait,
    commit = function() end}
end

-- An unlimited identity is allowed and charged nothing; its numbers are not shown.
local function unlimited_decision()
  return {allowed = true, kept_remaining = 0, kept_reset = 0, taken_remaining = 0,
    taken_reset = 0, retry = 0, commit = function() end}
end

local function read_overrides(limits)
  for _, p in ipairs(limits) do
    if p.override then
      p.override_bits = read_override(p)
    end
  end
end

-- The key budgets a request's limits use: for each, whether its identity is new and, if so,
-- the budget's window and count. Limits over a used-up budget move to the overflow state
-- ("shared") or are marked refused ("deny").
local function apply_budgets(limits)
  local uses, order = {}, {}
  for _, p in ipairs(limits) do
    if p.budget then
      local u = uses[p.budget]
      if not u then
        u = {budget = BUDGETS[p.budget], keys = {}}
        uses[p.budget] = u
        order[#order + 1] = u
      end
      u.keys[#u.keys + 1] = p.key
    end
  end
  for _, u in ipairs(order) do
    if redis.call('EXISTS', unpack(u.keys)) == 0 then
      local b = u.budget
      local state = redis.call('HMGET', b.key, 'w', 'n')
      local counted = tonumber(state[1])
      u.window = math.floor(now.ms / b.window)
      -- A call stamped before the window the counter is in (calls reach Redis out of their
      -- clocks' order) counts in that newer window: restarting its own would let the newer
      -- window count from 0 again.
      if counted and counted > u.window then
        u.window = counted
      end
      u.count = counted == u.window and (tonumber(state[2]) or 0) or 0
      u.new = true
      u.over = u.count >= b.new_keys
    end
  end
  for _, p in ipairs(limits) do
    local u = p.budget and uses[p.budget]
    if u and u.over then
      p.over = true
      if u.budget.deny then
        p.refuse_ms = math.max(1, math.ceil((u.window + 1) * u.budget.window - now.ms))
      else
        p.key = p.overflow
      end
    end
  end
  return order
end

-- A new identity charged within its budget counts one against the budget's window.
local function charge_budgets(order, limits, charged)
  for _, u in ipairs(order) do
    if u.new and not u.over then
      local used = false
      for i, p in ipairs(limits) do
        if charged[i] and p.budget and BUDGETS[p.budget] == u.budget then
          used = true
        end
      end
      if used then
        redis.call('HSET', u.budget.key, 'w', string.format('%d', u.window),
          'n', string.format('%d', u.count + 1))
        redis.call('PEXPIRE', u.budget.key, math.ceil(2 * u.budget.window))
      end
    end
  end
end

-- A request that only adjusts what earlier calls charged, limit by limit: each limit's mode
-- is "refund" (gives back what an earlier charge took) or "settle" (charges a usage limit's
-- settlement, or releases a concurrency slot; see SETTLES in lib.lua). It takes nothing and
-- replies 1 for each limit.
local function adjust_request(limits)
  local reply = {1, #limits}
  read_overrides(limits)
  for _, p in ipairs(limits) do
    local adjust = p.refund or p.settle
    if not adjust then
      error('ERR decide: a request that adjusts holds only refunds and settlements')
    end
    -- An unlimited identity was charged nothing; a blocked one settles as configured.
    if not p.unlimited then
      adjust(p.key, p, now)
    end
    for _, v in ipairs({1, '0', '0', '0'}) do
      reply[#reply + 1] = v
    end
  end
  return reply
end

-- How many requests' worth of units a committed request takes (1: itself alone), and the
-- decisions that charge them; see "Leases" above.
local function lease_of(limits, decisions)
  local k = math.huge
  for i, p in ipairs(limits) do
    if not p.lease or p.unlimited or p.blocked then
      return 1, decisions
    end
    if p.cost > 0 then
      local room = math.min(p.lease.max_units, p.lease.fraction * decisions[i].kept_remaining)
      k = math.min(k, math.floor(room / p.cost))
    end
  end
  if k == math.huge or k < 2 then
    return 1, decisions
  end
  local leased = {}
  for i, p in ipairs(limits) do
    local whole_lease = setmetatable({cost = k * p.cost}, {__index = p})
    leased[i] = p.algorithm(p.key, whole_lease, now)
    if not leased[i].allowed then
      return 1, decisions
    end
  end
  return k, leased
end

-- A limit in mode "after": allowed while at least 1 unit is left, charging nothing.
local function decide_after(p)
  local d = p.algorithm(p.key, setmetatable({cost = 1}, {__index = p}), now)
  d.commit = function() end
  d.taken_remaining, d.taken_reset = d.kept_remaining, d.kept_reset
  return d
end

local function decide_request(limits)
  if limits[1].refund or limits[1].settle then
    return adjust_request(limits)
  end
  read_overrides(limits)
  -- Most calls carry no key budget: nothing to look up or count for them.
  local budgets = budget_count > 0 and apply_budgets(limits) or nil
  local decisions = {}
  local committed = true
  for i, p in ipairs(limits) do
    local d
    if p.refuse_ms then
      d = {allowed = false, kept_remaining = 0, kept_reset = p.refuse_ms, retry = p.refuse_ms}
    elseif p.blocked then
      d = blocked_decision(p)
    elseif p.unlimited then
      d = unlimited_decision()
    elseif p.after then
      d = decide_after(p)
    elseif p.settle or p.refund then
      error('ERR decide: a refund or settlement in a decision')
    else
      d = p.algorithm(p.key, p, now)
    end
    decisions[i] = d
    if not d.allowed and not p.shadow then
      committed = false
    end
  end
  local k = 1
  if committed then
    k, decisions = lease_of(limits, decisions)
  end
  local reply = {committed and k or 0, #limits}
  local charged = {}
  for i, d in ipairs(decisions) do
    charged[i] = committed and d.allowed
    if charged[i] then
      d.commit()
    end
    local p = limits[i]
    local outcome = (d.allowed and 1 or 0) + (p.over and 2 or 0) + (p.override_bits or 0)
      + 16 * (p.override_quota or 0)
    reply[#reply + 1] = outcome
    -- Debt is never shown as a negative remaining.
    local left = charged[i] and d.taken_remaining or d.kept_remaining
    reply[#reply + 1] = wire_number(math.max(0, left))
    reply[#reply + 1] = math.ceil(charged[i] and d.taken_reset or d.kept_reset)
    reply[#reply + 1] = d.retry
  end
  if budgets then
    charge_budgets(budgets, limits, charged)
  end
  return reply
end

-- What pcall caught: Redis's error text (a string, or a table {err = "..."} in some
-- versions) or a Lua runtime error.
local function error_text(e)
  if type(e) == 'table' and e.err then
    return e.err
  end
  return tostring(e)
end


-- The fast request's limit (its definition's `fast`, with the request's key and cost) and
-- whether it is a shadow one; nil when the request at `a` is not of that shape (then the
-- general path reads it, and reports what is wrong with it).
local function read_fast(a, definitions)
  if ARGV[a] ~= '1' then
    return nil
  end
  local def = definitions[number_of(ARGV[a + 2]) or 0]
  local p = def and def.fast
  if not p then
    return nil
  end
  local key, cost = KEYS[number_of(ARGV[a + 1]) or 0], number_of(ARGV[a + 3])
  if not (key and cost and cost >= 0) then
    return nil
  end
  p.key, p.cost = key, cost
  return p, def.shadow
end

-- Decides the fast request: charged when its limit allows, committed unless an enforced
-- limit refused; the reply's values after n as decide_request gives them.
local function fast_request(p, shadow)
  local alone = p.alone
  if alone then
    local allowed, left, reset, retry = alone(p.key, p, now)
    return (allowed or shadow) and 1 or 0, allowed and 1 or 0,
      wire_number(math.max(0, left)), math.ceil(reset), retry
  end
  local d = p.algorithm(p.key, p, now)
  if d.allowed then
    d.commit()
  end
  local left = d.allowed and d.taken_remaining or d.kept_remaining
  local reset = d.allowed and d.taken_reset or d.kept_reset
  return (d.allowed or shadow) and 1 or 0, d.allowed and 1 or 0,
    wire_number(math.max(0, left)), math.ceil(reset), d.retry
end

local BROKEN = 'ERR decide: expected the limit definitions, then per request n and its limits'
local definitions, a = read_definitions(5 + 4 * budget_count)
if not definitions then
  return redis.error_reply(BROKEN)
end
local out = {requests}
for _ = 1, requests do
  local p, shadow = read_fast(a, definitions)
  if p then
    local ok, committed, outcome, left, reset, retry = pcall(fast_request, p, shadow)
    local o = #out
    if ok then
      out[o + 1], out[o + 2], out[o + 3] = committed, 1, outcome
      out[o + 4], out[o + 5], out[o + 6] = left, reset, retry
    else
      out[o + 1], out[o + 2] = -1, error_text(committed)
    end
    a = a + 4
  else
    local limits, next_a = read_request(a, definitions)
    if not limits then
      return redis.error_reply(BROKEN)
    end
    a = next_a
    local entry
    if type(limits) == 'string' then
      entry = {-1, limits}
    else
      local ok, result = pcall(decide_request, limits)
      entry = ok and result or {-1, error_text(result)}
    end
    for _, v in ipairs(entry) do
      out[#out + 1] = v
    end
  end
end
if a ~= #ARGV + 1 then
  return redis.error_reply(BROKEN)
end
if SLOT_MAP then
  local map = redis.pcall('CLUSTER', 'SLOTS')
  local ranges, nodes, count = {}, {}, 0
  if type(map) == 'table' and not map.err then
    for _, r in ipairs(map) do
      local master = type(r[3]) == 'table' and r[3][3]
      if master then
        if not nodes[master] then
          count = count + 1
          nodes[master] = count
        end
        ranges[#ranges + 1] = {r[1], r[2], nodes[master]}
      end
    end
  end
  out[#out + 1] = 'slots'
  out[#out + 1] = #ranges
  for _, r in ipairs(ranges) do
    out[#out + 1] = r[1]
    out[#out + 1] = r[2]
    out[#out + 1] = r[3]
  end
end
return out
