-- Decides a batch of requests in one call: in arrival order, each all or nothing over its own
-- limits, exactly as if each had been sent alone (a request sees what the ones before it in the
-- batch charged). The argument layout is built in one place, ratelimit_core::bridge::DecideCall.
--
-- KEYS[k]    the distinct state keys of the batch
-- ARGV[1]    clock: Unix time in ns (decimal string) from the caller, or "redis" to use TIME
-- ARGV[2]    deadline: Unix ms after which the caller has given up (plus the clock skew it
--            allows), or "0" for none. A call that reaches Redis later is refused whole
--            ("EXPIRED ...") and charges nothing: its requests were already decided by policy.
-- ARGV[3]    number of requests R
-- then, per request: its number of limits n, then seven per limit:
--            key index (into KEYS), algorithm, limit, window (ms), burst, cost,
--            "enforce" | "shadow"
--
-- Within a request, tokens are taken only if every enforced limit allows; then every limit
-- that allows is charged (a shadow limit that refuses is not). Returns
--   {R, then per request either
--      committed (1|0), n, then per limit: allowed (1|0), remaining, reset_ms, retry_ms
--    or -1, "ERR ..." when that request alone could not be decided (bad arguments, a Redis
--      error such as WRONGTYPE): the others are still decided}
-- with the numbers as strings (Redis would truncate Lua numbers to integers). remaining and
-- reset_ms describe the state after this request: charged if committed, untouched if not.
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
local now = {str = now_str}
now.ms = elapsed_ms('0', now_str)

local requests = tonumber(ARGV[3])
if not requests or requests < 0 or requests ~= math.floor(requests) then
  return redis.error_reply('ERR decide: bad request count')
end

-- Reads one request's limits from ARGV at `a`; returns the limits (or an error text) and
-- the position after them, or nil when the layout itself is broken.
local function read_request(a)
  local n = tonumber(ARGV[a])
  if not n or n < 1 or n ~= math.floor(n) or a + 7 * n > #ARGV then
    return nil
  end
  local limits, problem = {}, nil
  for i = 1, n do
    local b = a + (i - 1) * 7
    local p = {
      key = KEYS[tonumber(ARGV[b + 1]) or 0],
      algorithm = ALGORITHMS[ARGV[b + 2]],
      limit = tonumber(ARGV[b + 3]),
      window = tonumber(ARGV[b + 4]),
      burst = tonumber(ARGV[b + 5]),
      cost = tonumber(ARGV[b + 6]),
      shadow = ARGV[b + 7] == 'shadow',
    }
    if not p.key or not p.algorithm or not p.limit or p.limit < 1 or not p.window
        or p.window <= 0 or not p.burst or p.burst < 1 or not p.cost or p.cost < 0 then
      problem = problem or ('ERR decide: bad arguments for limit ' .. i)
    end
    limits[i] = p
  end
  return problem or limits, a + 1 + 7 * n
end

local function decide_request(limits)
  local decisions = {}
  local committed = true
  for i, p in ipairs(limits) do
    local d = p.algorithm(p.key, p, now)
    decisions[i] = d
    if not d.allowed and not p.shadow then
      committed = false
    end
  end
  local reply = {committed and 1 or 0, #limits}
  for _, d in ipairs(decisions) do
    local charged = committed and d.allowed
    if charged then
      d.commit()
    end
    reply[#reply + 1] = d.allowed and 1 or 0
    reply[#reply + 1] = tostring(charged and d.taken_remaining or d.kept_remaining)
    reply[#reply + 1] = tostring(math.ceil(charged and d.taken_reset or d.kept_reset))
    reply[#reply + 1] = tostring(d.retry)
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

local out = {requests}
local a = 4
for _ = 1, requests do
  local limits, next_a = read_request(a)
  if not limits then
    return redis.error_reply('ERR decide: expected n, then 7 arguments per limit')
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
if a ~= #ARGV + 1 then
  return redis.error_reply('ERR decide: expected n, then 7 arguments per limit')
end
return out
