-- Token bucket, decided atomically: refill by elapsed time, then take or refuse.
--
-- KEYS[1]  the bucket, a hash with two fields:
--            tokens  tokens left after the last decision (decimal string, may be fractional)
--            ts      Unix time of the last decision in nanoseconds, stored exactly as given
-- ARGV[1]  rate: tokens added per second (decimal, > 0, may be fractional)
-- ARGV[2]  capacity: most tokens the bucket holds (>= 1)
-- ARGV[3]  now: Unix time in nanoseconds (decimal integer string), from the caller's clock
-- ARGV[4]  requested: tokens this request costs (>= 0)
--
-- Returns {allowed, tokens, retry_after_ms}:
--   allowed         1 when the tokens were taken, 0 when the request is refused
--   tokens          tokens left, as a string (Redis would truncate a Lua number)
--   retry_after_ms  when refused, ms until enough tokens will be there (string); "0" when allowed

local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = ARGV[3]
local requested = tonumber(ARGV[4])
if not rate or rate <= 0 or not capacity or capacity < 1 or not requested or requested < 0
    or not string.match(now, '^%d+$') then
  return redis.error_reply('ERR token_bucket: bad arguments')
end

-- Nanosecond timestamps (~1.8e18) do not fit a double exactly, so the difference is taken
-- on the seconds and nanoseconds parts separately: exact elapsed time, not +-256 ns.
local function split_ns(ts)
  local len = string.len(ts)
  if len <= 9 then
    return 0, tonumber(ts)
  end
  return tonumber(string.sub(ts, 1, len - 9)), tonumber(string.sub(ts, len - 8))
end

-- Is timestamp a later than b? Equal-length digit strings compare like numbers.
local function later(a, b)
  if string.len(a) ~= string.len(b) then
    return string.len(a) > string.len(b)
  end
  return a > b
end

local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local last = state[2]
local stamp = now

if tokens == nil or not last then
  tokens = capacity
else
  -- A clock that went backwards refills nothing, and the stored time never moves back,
  -- or the same interval would be credited twice once the clock catches up.
  if later(now, last) then
    local now_s, now_ns = split_ns(now)
    local last_s, last_ns = split_ns(last)
    local elapsed = (now_s - last_s) + (now_ns - last_ns) / 1e9
    tokens = math.min(capacity, tokens + elapsed * rate)
  else
    stamp = last
  end
  tokens = math.min(capacity, tokens)
end

local allowed = 0
local retry_after_ms = 0
if tokens >= requested then
  tokens = tokens - requested
  allowed = 1
else
  retry_after_ms = math.ceil((requested - tokens) / rate * 1000)
end

redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', stamp)
-- Once the bucket could have refilled completely its state says nothing: let it go.
redis.call('EXPIRE', KEYS[1], math.ceil(capacity / rate) + 60)

return {allowed, tostring(tokens), tostring(retry_after_ms)}
