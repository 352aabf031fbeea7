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
-- then, per request: its number of limits n, then nine per limit:
--            key index (into KEYS), algorithm, limit, window, burst, cost,
--            "enforce" | "shadow", budget index (0: none), overflow key index (0: none)
--            The window is its length in ms (digits), or for fixed_window a calendar window:
--            "D", "W" or "M" (a day, an ISO week from Monday, a month from the 1st), then its
--            UTC offset in minutes, signed: "M+330" is a month at UTC+05:30, "D-300" a day at
--            UTC-05:00, "W+0" a week in UTC. Parsed only when it is not plain digits.
--            or, to give back what an earlier call charged (Redis Cluster: another slot
--            refused the request), mode "refund", then the charge's clock (Unix ns) and the
--            remaining it replied. A refund request takes nothing and replies 1 for each
--            limit; its clock (ARGV[1]) must be no earlier than any decision on its keys.
--            or, to ask for a lease (token_bucket, gcra, fixed_window), mode "lease", then its
--            max units and fraction: see "Leases" below.
--            or, for a limit metered by usage in mode `after`, mode "after", then "0", "0":
--            allowed while at least 1 unit is left, charging nothing (cost is ignored).
--            or, to settle a usage limit (a charge of a signed number of units that never
--            refuses: positive is debt, negative gives back; see SETTLES in lib.lua), mode
--            "settle", then the delta and "0"; for a concurrency limit, a release of the slot
--            the request holds: "settle", "-1" and the request's id. A settle request takes
--            nothing and replies 1 for each limit, like a refund request; a request that
--            adjusts holds only refunds and settles, or none.
--            or, for a concurrency limit (always), mode "hold", then the request's id (unique
--            per request, the member its slot is held by) and "0".
--
-- Within a request, tokens are taken only if every enforced limit allows; then every limit
-- that allows is charged (a shadow limit that refuses is not). Returns
--   {R, then per request either
--      committed (1|0), n, then per limit: outcome, remaining, reset_ms, retry_ms
--    or -1, "ERR ..." when that request alone could not be decided (bad arguments, a Redis
--      error such as WRONGTYPE): the others are still decided}
-- with the numbers as strings (Redis would truncate Lua numbers to integers). remaining and
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
-- with). "unlimited" allows and charges nothing, "blocked" refuses with the override's TTL as
-- retry (0 when it has none), "limit" replaces the limit and burst.
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
local KEYS, ARGV, SLOT_MAP = KEYS, ARGV, false
if #KEYS == 0 and #ARGV >= 3 then
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
local now = {str = now_str}
now.ms = elapsed_ms('0', now_str)

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

-- Reads one request's limits from ARGV at `a`; returns the limits (or an error text) and
-- the position after them, or nil when the layout itself is broken.
local function read_request(a)
  local n = tonumber(ARGV[a])
  if not n or n < 1 or n ~= math.floor(n) or a + 9 * n > #ARGV then
    return nil
  end
  local limits, problem = {}, nil
  for i = 1, n do
    local b = a + (i - 1) * 9
    local refund = ARGV[b + 7] == 'refund'
    local lease = ARGV[b + 7] == 'lease'
    local settle = ARGV[b + 7] == 'settle'
    local after = ARGV[b + 7] == 'after'
    local hold = ARGV[b + 7] == 'hold'
    local concurrency = ARGV[b + 2] == 'concurrency'
    local budget = not (refund or lease or settle or after or hold) and tonumber(ARGV[b + 8]) or 0
    -- "i", or "i:j" for a limit that reads its identity's override at KEYS[j].
    local key_index, override_index = tonumber(ARGV[b + 1]), nil
    if not key_index then
      key_index, override_index = string.match(ARGV[b + 1], '^(%d+):(%d+)$')
    end
    local p = {
      key = KEYS[tonumber(key_index) or 0],
      override = override_index and KEYS[tonumber(override_index)],
      algorithm_name = ARGV[b + 2],
      algorithm = ALGORITHMS[ARGV[b + 2]],
      limit = tonumber(ARGV[b + 3]),
      window = tonumber(ARGV[b + 4]),
      burst = tonumber(ARGV[b + 5]),
      cost = tonumber(ARGV[b + 6]),
      shadow = ARGV[b + 7] == 'shadow',
      budget = budget ~= 0 and budget or nil,
      overflow = KEYS[tonumber(ARGV[b + 9]) or 0],
      refund = refund and REFUNDS[ARGV[b + 2]],
      charged_at = refund and ARGV[b + 8],
      left = refund and tonumber(ARGV[b + 9]),
      lease = lease and {max_units = tonumber(ARGV[b + 8]), fraction = tonumber(ARGV[b + 9])},
      settle = settle and SETTLES[ARGV[b + 2]],
      delta = settle and tonumber(ARGV[b + 8]),
      after = after,
      member = (hold and ARGV[b + 8]) or (settle and concurrency and ARGV[b + 9]) or nil,
    }
    local window_ok = p.window and p.window > 0
    if not p.window and ARGV[b + 2] == 'fixed_window' then
      p.calendar = calendar_of(ARGV[b + 4])
      window_ok = p.calendar ~= nil
    end
    if not p.key or (override_index and not p.override) or not p.algorithm or not p.limit
        or p.limit < 1 or not window_ok
        or not p.burst or p.burst < 1 or not p.cost or p.cost < 0
        or (p.budget and (not BUDGETS[p.budget] or not p.overflow))
        or (refund and (not p.refund or not string.match(p.charged_at, '^%d+$')
          or not p.left or p.left < 0))
        or (lease and (not LEASABLE[ARGV[b + 2]] or not whole(p.lease.max_units)
          or p.lease.max_units < 1 or not p.lease.fraction or p.lease.fraction <= 0
          or p.lease.fraction > 1))
        or (settle and (not p.settle or not p.delta or p.delta ~= math.floor(p.delta)))
        or (after and not SETTLES[ARGV[b + 2]])
        or (concurrency and not ((hold or settle) and p.member and p.member ~= ''))
        or (hold and not concurrency) then
      problem = problem or ('ERR decide: bad arguments for limit ' .. i)
    end
    limits[i] = p
  end
  return problem or limits, a + 1 + 9 * n
end

-- An override, as operators write it (ratelimit-admin): a hash with `mode` "limit" (then
-- `limit`, and `burst` for the algorithms that have one), "unlimited" or "blocked"; its TTL is
-- its expiry. Reads it into p and returns the outcome bits it adds: 4 when it applies, 8 when
-- it is malformed (then the config's numbers apply).
local MAX_LIMIT = 1000000000000
local MAX_LOG_LIMIT = 10000
local MAX_STATE_LIFETIME_MS = 2 * 366 * 86400000
local HAS_BURST = {token_bucket = true, gcra = true}
local function read_override(p)
  local o = redis.pcall('HMGET', p.override, 'mode', 'limit', 'burst')
  if type(o) ~= 'table' or o.err then
    return 8
  end
  local mode = o[1]
  if not mode then
    return (o[2] or o[3]) and 8 or 0
  end
  if mode == 'unlimited' or mode == 'blocked' then
    if o[2] or o[3] then
      return 8
    end
    p[mode] = true
    return 4
  end
  local function number(text)
    return text and string.match(text, '^[1-9]%d*$') and tonumber(text)
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
  local ttl = redis.call('PTTL', p.override)
  local wait = ttl > 0 and ttl or 0
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
    reply[#reply + 1] = tostring(math.max(0, left))
    reply[#reply + 1] = tostring(math.ceil(charged[i] and d.taken_reset or d.kept_reset))
    reply[#reply + 1] = tostring(d.retry)
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

local out = {requests}
local a = 5 + 4 * budget_count
for _ = 1, requests do
  local limits, next_a = read_request(a)
  if not limits then
    return redis.error_reply('ERR decide: expected n, then 9 arguments per limit')
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
  return redis.error_reply('ERR decide: expected n, then 9 arguments per limit')
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
