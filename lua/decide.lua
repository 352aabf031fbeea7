-- Decides every limit of one request in one call, all or nothing.
--
-- KEYS[i]    state key of limit i
-- ARGV[1]    clock: Unix time in ns (decimal string) from the caller, or "redis" to use TIME
-- ARGV[2]    number of limits n (= #KEYS)
-- ARGV[3..]  six per limit: algorithm, limit, window (ms), burst, cost, "enforce" | "shadow"
--
-- Tokens are taken only if every enforced limit allows; then every limit that allows is
-- charged (a shadow limit that refuses is not). Returns
--   {committed (1|0), n, then per limit: allowed (1|0), remaining, reset_ms, retry_ms}
-- with the numbers as strings (Redis would truncate Lua numbers to integers). remaining and
-- reset_ms describe the state after this call: charged if committed, untouched if not.
local now_str = ARGV[1]
if now_str == 'redis' then
  local t = redis.call('TIME')
  now_str = t[1] .. string.format('%06d', tonumber(t[2])) .. '000'
end
if not string.match(now_str, '^%d+$') then
  return redis.error_reply('ERR decide: clock must be Unix ns digits or "redis"')
end
local now = {str = now_str}
now.ms = elapsed_ms('0', now_str)

local n = tonumber(ARGV[2])
if not n or n ~= #KEYS or #ARGV ~= 2 + 6 * n then
  return redis.error_reply('ERR decide: expected 6 arguments per key')
end

local decisions = {}
local committed = true
for i = 1, n do
  local a = 2 + (i - 1) * 6
  local algorithm = ALGORITHMS[ARGV[a + 1]]
  local p = {
    limit = tonumber(ARGV[a + 2]),
    window = tonumber(ARGV[a + 3]),
    burst = tonumber(ARGV[a + 4]),
    cost = tonumber(ARGV[a + 5]),
    shadow = ARGV[a + 6] == 'shadow',
  }
  if not algorithm or not p.limit or p.limit < 1 or not p.window or p.window <= 0
      or not p.burst or p.burst < 1 or not p.cost or p.cost < 0 then
    return redis.error_reply('ERR decide: bad arguments for limit ' .. i)
  end
  local d = algorithm(KEYS[i], p, now)
  d.shadow = p.shadow
  decisions[i] = d
  if not d.allowed and not p.shadow then
    committed = false
  end
end

local reply = {committed and 1 or 0, n}
for i = 1, n do
  local d = decisions[i]
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
