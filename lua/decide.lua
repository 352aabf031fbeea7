-- Decides a batch of requests in one call: in arrival order, each all or nothing over its own
-- limits, exactly as if each had been sent alone (a request sees what the ones before it in the
-- batch charged). The argument layout is defined in one place, ratelimit_core::bridge::wire,
-- which also renders wire.lua (the mode names, the values each adds, the field patterns, the
-- outcome bits and the bounds, as locals) ahead of this code.
--
-- KEYS[k]    the distinct keys of the batch (state, key-budget counters, overflow state)
-- ARGV[1]    clock: Unix time in ns (decimal string) from the caller, or "redis" to use TIME
-- ARGV[2]    deadline: Unix ms after which the caller has given up (plus the clock skew it
--            allows), or "0" for none. A call that reaches Redis later is refused whole
--            ("EXPIRED ...") and charges nothing: its requests were already decided by policy.
-- ARGV[3]    the head: the number of requests R, of key budgets B and of limit definitions D,
--            joined by "~"
-- then four arguments per key budget: counter key index, new keys per window, window (ms),
--            "shared" | "deny"
-- then one argument per limit definition of seven fields joined by "~": algorithm, limit, window, burst, mode, budget index
--            (0: none), overflow key index (0: none). A batch's requests on one rule's limit
--            share one definition.
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
--            of the hold the request took: "-1" and the request's id. A settle request takes
--            nothing and replies 1 for each limit, like a refund request; a request that
--            adjusts holds only refunds and settles, or none.
--            or, for a concurrency limit (always), "hold": the limit adds the request's id
--            (unique per request, the member its hold is kept under).
-- then, per request: its number of limits n, then per limit one argument of three fields
--            joined by "~": key index (into KEYS), definition index, cost; then what its
--            definition's mode adds (above), one argument each.
-- A definition's or a limit's argument is read once and then found by its text (see
-- DEFINITIONS and LIMITS below): a worker's calls repeat the same few.
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
-- "blocked"; see read_override below). wire.lua names these bits (OUTCOME_*).
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

-- The call's own state, set by open_call at the start of every call. The same code runs as a
-- Redis Function (the library's top level runs once, at FUNCTION LOAD, and stays loaded) and as
-- a script (EVALSHA runs it all on every call): nothing below may carry from one call to the
-- next except through these, which open_call resets.
local KEYS, ARGV, SLOT_MAP, redis_time, requests, BUDGETS, budget_count, definition_count
-- The call's clock: {str = Unix ns as its digits, ms = Unix ms}, filled in by open_call.
local now = {}
-- The key budgets of a call that has none.
local NO_BUDGETS = {}

local function time_now()
  redis_time = redis_time or redis.call('TIME')
  return redis_time
end

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

-- A request of one limit in mode "enforce" or "shadow", with no key budget or override, on an
-- algorithm whose window is its length in ms: the shape of nearly every decision. It is
-- decided without building the general path's tables (see fast_request below).
local FAST = {token_bucket = true, gcra = true, fixed_window = true,
  sliding_window_counter = true, sliding_window_log = true}

-- Definitions read from their texts, kept from call to call like NUMBERS (lib.lua): building
-- one costs far more than finding it.
local DEFINITIONS = {}

-- A definition from its texts (algorithm, limit, window, burst, mode), its key budget's
-- index (0: none, else a number or nil when malformed) and overflow key.
local function build_definition(name, limit, window_text, burst, mode, budget, overflow)
  local window = number_of(window_text)
  load_algorithm(name)
  local def = {
    algorithm_name = name,
    algorithm = ALGORITHMS[name],
    limit = number_of(limit),
    window = window,
    burst = number_of(burst),
    mode = mode,
    extras = MODE_VALUES[mode],
    -- Set below; named here so that the table is made at its full size at once.
    shadow = mode == MODE_SHADOW, after = mode == MODE_AFTER, ok = false, meta = false,
    fast = false, budget = nil, overflow = nil, calendar = nil,
  }
  -- A concurrency limit takes a hold or releases it, and only it takes one.
  local ok = def.extras ~= nil
  if name == 'concurrency' then
    ok = ok and (mode == MODE_HOLD or mode == MODE_SETTLE)
  else
    ok = ok and mode ~= MODE_HOLD and (mode ~= MODE_AFTER or SETTLES[name] ~= nil)
  end
  if budget ~= 0 then
    def.budget, def.overflow = budget, overflow
    ok = ok and (mode == MODE_ENFORCE or mode == MODE_SHADOW) and BUDGETS[budget] and def.overflow
  end
  local window_ok = window and window > 0
  if not window and name == 'fixed_window' then
    def.calendar = calendar_of(window_text)
    window_ok = def.calendar ~= nil
  end
  def.ok = ok and def.algorithm and def.limit and def.limit >= 1 and window_ok
    and def.burst and def.burst >= 1 and true or false
  def.meta = {__index = def}
  -- The one-limit requests decide_fast takes: no key budget, a window in ms.
  if def.ok and FAST[name] and (mode == MODE_ENFORCE or mode == MODE_SHADOW) and not def.budget
      and window then
    def.fast = {algorithm = def.algorithm, alone = DECIDE_ALONE[name], limit = def.limit,
      window = window, burst = def.burst}
  end
  return def
end

-- The definition an argument holds, or nil when it is not seven fields. One with no key
-- budget is built once and then found in DEFINITIONS by its text; one with a key budget
-- names this call's budget and overflow key, and is built for the call.
local function definition_of(text)
  local def = DEFINITIONS[text]
  if def then
    return def
  end
  local name, limit, window, burst, mode, budget, overflow = string.match(text or '',
    DEFINITION_FIELDS)
  if not name then
    return nil
  end
  budget = number_of(budget)
  if budget ~= 0 then
    return build_definition(name, limit, window, burst, mode, budget,
      KEYS[number_of(overflow) or 0])
  end
  return keep(DEFINITIONS, text, build_definition(name, limit, window, burst, mode, 0, nil),
    true)
end

-- Reads the D limit definitions at `a`: returns them and the position after them, or nil when
-- the layout is broken. A definition's fields are its limits' fields (its `meta` makes them
-- so); `ok` is false when they are malformed, and each limit using it is refused alone.
local DEFS = {}
local function read_definitions(a, count)
  if a + count - 1 > #ARGV then
    return nil
  end
  -- Kept from call to call like REPLY and written over: a limit's definition index is
  -- checked against this call's count before it is read.
  local definitions = DEFS
  for d = 1, count do
    local text = ARGV[a + d - 1]
    local def = DEFINITIONS[text or false] or definition_of(text)
    if not def then
      return nil
    end
    definitions[d] = def
  end
  return definitions, a + count
end

-- A limit's argument, "i~d~c" (key index, or "i:j" for a limit that reads its identity's
-- override at KEYS[j]; definition index; cost), read once and then found in LIMITS by its
-- text: {i, j, d, c}, each false when malformed; or false when the argument is not three
-- fields.
local LIMITS = {}
local function limit_of(text)
  local l = LIMITS[text or false]
  if l ~= nil then
    return l
  end
  l = false
  local key, def, cost = string.match(text or '', LIMIT_FIELDS)
  if key then
    local i, j = tonumber(key), nil
    if not i then
      i, j = string.match(key, KEY_AND_OVERRIDE)
      i, j = tonumber(i), tonumber(j)
    end
    l = {i or false, j or false, tonumber(def) or false, tonumber(cost) or false}
  end
  return text and keep(LIMITS, text, l) or l
end

-- The general path: requests of several limits, key budgets, overrides, leases, holds,
-- refunds and settlements (run decides the fast request itself). Defined at its first use
-- (load_general): a script builds its functions on every call, and most calls have no need
-- of them.
local read_request, decide_request
local function load_general()
  -- The mode-specific fields of a limit in mode `mode`, from the values it adds (x, y); false
  -- when they are malformed.
  local function read_mode(p, mode, x, y)
    local name = p.algorithm_name
    local concurrency = name == 'concurrency'
    if mode == MODE_REFUND then
      p.refund, p.charged_at, p.left = REFUNDS[name], x, tonumber(y)
      return p.refund and string.match(x, '^%d+$') and p.left and p.left >= 0 and not concurrency
    elseif mode == MODE_LEASE then
      local lease = {max_units = tonumber(x), fraction = tonumber(y)}
      p.lease = lease
      return LEASABLE[name] and whole(lease.max_units) and lease.max_units >= 1
        and lease.fraction and lease.fraction > 0 and lease.fraction <= 1
    elseif mode == MODE_SETTLE then
      p.settle, p.delta = SETTLES[name], tonumber(x)
      if concurrency then
        p.member = y
      end
      return p.settle and p.delta and p.delta == math.floor(p.delta)
        and (not concurrency or y ~= '')
    elseif mode == MODE_HOLD then
      p.member = x
      return x ~= ''
    end
    return true
  end

  -- Reads one request's limits from ARGV at `a`; returns the limits (or an error text) and
  -- the position after them, or nil when the layout itself is broken.
  function read_request(a, definitions)
    local n = number_of(ARGV[a])
    if not n or n < 1 or n ~= math.floor(n) or a + n > #ARGV then
      return nil
    end
    local limits, problem = {}, nil
    local b = a + 1
    for i = 1, n do
      local l = limit_of(ARGV[b])
      local d = l and l[3]
      local def = d and d <= definition_count and definitions[d]
      if not def or b + def.extras > #ARGV then
        return nil
      end
      local p = setmetatable({key = KEYS[l[1]], cost = l[4]}, def.meta)
      local ok = def.ok and read_mode(p, def.mode, ARGV[b + 1], ARGV[b + 2])
      if l[2] then
        p.override = KEYS[l[2]]
        ok = ok and p.override
      end
      if not (ok and p.key and p.cost and p.cost >= 0) then
        problem = problem or ('ERR decide: bad arguments for limit ' .. i)
      end
      limits[i] = p
      b = b + 1 + def.extras
    end
    return problem or limits, b
  end

  -- An override, as operators write it (ratelimit-admin): a hash with `mode` "limit" (then
  -- `limit`, and `burst` for the algorithms that have one), "unlimited" or "blocked", and an
  -- optional expiry `until` (Unix ms, on the decision's clock). The expiry is a field, not a
  -- TTL, so that an eviction policy reaching only keys with a TTL (volatile-lru) never reaches an
  -- override; an override past its `until` is absent, and gets a short TTL so it goes. (One
  -- written with a TTL of its own instead still works: Redis removes it at its time.)
  -- Reads it into p and returns the outcome bits it adds: OUTCOME_OVERRIDE when it applies,
  -- OUTCOME_BAD_OVERRIDE when it is malformed (then the config's numbers apply). The bounds
  -- are the config's (wire.lua).
  local function read_override(p)
    local o = redis.pcall('HMGET', p.override, 'mode', 'limit', 'burst', 'until')
    if type(o) ~= 'table' or o.err then
      return OUTCOME_BAD_OVERRIDE
    end
    local mode = o[1]
    if not mode then
      return (o[2] or o[3] or o[4]) and OUTCOME_BAD_OVERRIDE or 0
    end
    local function number(text)
      return text and string.match(text, '^[1-9]%d*$') and tonumber(text)
    end
    if o[4] then
      local expiry = number(o[4])
      if not expiry then
        return OUTCOME_BAD_OVERRIDE
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
        return OUTCOME_BAD_OVERRIDE
      end
      p[mode] = true
      return OUTCOME_OVERRIDE
    end
    local limit, burst = number(o[2]), o[3] and number(o[3])
    if mode ~= 'limit' or not limit or limit > MAX_LIMIT
        or (p.algorithm_name == 'sliding_window_log' and limit > MAX_LOG_LIMIT)
        or (o[3] and (not burst or burst > MAX_LIMIT or not HAS_BURST[p.algorithm_name])) then
      return OUTCOME_BAD_OVERRIDE
    end
    burst = burst or limit
    -- A calendar window is a month at most.
    if burst / limit * (p.window or 31 * 86400000) > MAX_STATE_LIFETIME_MS then
      return OUTCOME_BAD_OVERRIDE
    end
    p.limit, p.burst = limit, burst
    p.override_quota = HAS_BURST[p.algorithm_name] and burst or limit
    return OUTCOME_OVERRIDE
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
  -- settlement, or releases a concurrency hold; see SETTLES in lib.lua). It takes nothing and
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

  function decide_request(limits)
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
      local outcome = (d.allowed and OUTCOME_ALLOWED or 0) + (p.over and OUTCOME_OVER_BUDGET or 0)
        + (p.override_bits or 0) + OUTCOME_QUOTA_UNIT * (p.override_quota or 0)
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
end

-- What pcall caught: Redis's error text (a string, or a table {err = "..."} in some
-- versions) or a Lua runtime error.
local function error_text(e)
  if type(e) == 'table' and e.err then
    return e.err
  end
  return tostring(e)
end

local BROKEN = 'ERR decide: expected the limit definitions, then per request n and its limits'

-- The reply's table, kept from call to call and written over: Redis reads the reply before the
-- call returns, up to its first nil, and building the table again costs more. (Never `#` on
-- it: past that nil it may hold what a longer reply left.)
local REPLY = {}

-- A call's head, "r~b~d" (its numbers of requests, key budgets and definitions), read once and
-- then found in HEADS by its text: {r, b, d}, or false when it is not three whole numbers.
local HEADS = {}
local function head_of(text)
  local head = false
  local r, b, d = string.match(text or '', HEAD_FIELDS)
  r, b, d = tonumber(r), tonumber(b), tonumber(d)
  if r and b and d and r >= 0 and b >= 0 and d >= 0 and r == math.floor(r) and b == math.floor(b)
      and d == math.floor(d) then
    head = {r, b, d}
  end
  return text and keep(HEADS, text, head, true) or head
end

-- Where the run of a call's requests is: the next argument, the reply's last entry, the
-- requests begun, and the argument after the one being decided (nil until it is known).
local run_a, run_o, run_done, run_after

-- Decides the call's requests after the first run_done, in order, into REPLY; returns BROKEN
-- when the layout is broken. A request whose deciding raises an error (a Redis error such as
-- WRONGTYPE) ends the run there: decide records the error for that request alone and runs on
-- from the next, so that a call needs one pcall, not one per request.
local function run(definitions)
  local out = REPLY
  while run_done < requests do
    local a = run_a
    run_done, run_after = run_done + 1, nil
    -- The fast request: one limit in mode enforce or shadow, no key budget or override, a
    -- window in ms (its definition's `fast`); else the general path reads it, and reports
    -- what is wrong with it.
    local p, shadow
    if ARGV[a] == '1' then
      local text = ARGV[a + 1]
      local l = LIMITS[text or false] or limit_of(text)
      if l and not l[2] then
        local d = l[3]
        local def = d and d <= definition_count and definitions[d]
        local fast = def and def.fast
        local key, cost = KEYS[l[1]], l[4]
        if fast and key and cost and cost >= 0 then
          fast.key, fast.cost = key, cost
          p, shadow = fast, def.shadow
        end
      end
    end
    if p then
      run_after = a + 2
      local allowed, left, reset, retry
      local alone = p.alone
      if alone then
        local kept, kept_reset, taken, taken_reset, a1, a2, a3, a4
        allowed, kept, kept_reset, retry, taken, taken_reset, a1, a2, a3, a4 =
          alone[1](p.key, p, now)
        if allowed then
          alone[2](p.key, a1, a2, a3, a4)
          left, reset, retry = taken, taken_reset, 0
        else
          left, reset = kept, kept_reset
        end
      else
        local d = p.algorithm(p.key, p, now)
        if d.allowed then
          d.commit()
        end
        allowed, retry = d.allowed, d.retry
        left = allowed and d.taken_remaining or d.kept_remaining
        reset = allowed and d.taken_reset or d.kept_reset
      end
      -- Charged when its limit allows, committed unless an enforced limit refused; the
      -- values as decide_request gives them (wire_number, inline).
      if left < 0 then
        left = 0
      end
      local o = run_o
      out[o + 1], out[o + 2] = (allowed or shadow) and 1 or 0, 1
      out[o + 3], out[o + 4] = allowed and OUTCOME_ALLOWED or 0, left == floor(left) and left or tostring(left)
      out[o + 5], out[o + 6] = ceil(reset), retry
      run_o = o + 6
    else
      if not read_request then
        load_general()
      end
      local limits, after = read_request(a, definitions)
      if not limits then
        return BROKEN
      end
      run_after = after
      local entry = type(limits) == 'string' and {-1, limits} or decide_request(limits)
      local o = run_o
      for i = 1, #entry do
        out[o + i] = entry[i]
      end
      run_o = o + #entry
    end
    run_a = run_after
  end
end


-- Decides the call (keys, args): the reply described at the top of this file.
local function decide(keys, args)
  if not floor then
    localize()
  end
  -- The head of the call: its clock, deadline, request count and key budgets, into the
  -- call's state.
  KEYS, ARGV, SLOT_MAP = keys, args, false
  redis_time = nil
  if #KEYS == 0 and #ARGV >= 3 and ARGV[1] ~= 'redis' and not match(ARGV[1], '^%d+$') then
    local count = tonumber(ARGV[2])
    if not count or count ~= floor(count) or count < 1 or count + 2 > #ARGV then
      return redis.error_reply('ERR decide: bad key count')
    end
    local node_keys, node_args = {ARGV[1]}, {}
    for i = 2, count do
      node_keys[i] = ARGV[i + 2]
    end
    for i = count + 3, #ARGV do
      node_args[#node_args + 1] = ARGV[i]
    end
    KEYS, ARGV, SLOT_MAP = node_keys, node_args, ARGV[3] == '1'
  end

  local deadline = ARGV[2]
  if deadline ~= '0' then
    -- Checked as a whole number, as the clock is (a pattern costs more than the reading).
    local until_ms = tonumber(deadline)
    if not (until_ms and until_ms >= 0 and until_ms == floor(until_ms)) then
      return redis.error_reply('ERR decide: deadline must be Unix ms digits or "0"')
    end
    local t = time_now()
    -- TIME's seconds repeat from call to call (NUMBERS).
    if number_of(t[1]) * 1000 + floor(tonumber(t[2]) / 1000) > until_ms then
      return redis.error_reply('EXPIRED decide: the call reached Redis after its deadline')
    end
  end

  local now_str = ARGV[1]
  if now_str == 'redis' then
    local t = time_now()
    now_str = t[1] .. format('%06d', tonumber(t[2])) .. '000'
  end
  -- The call's clock, split once (see split): its seconds and its ns within the second, both
  -- checked as whole numbers (a pattern on the text would cost more than the reading).
  clock_ts = nil
  clock_s, clock_ns = split(now_str)
  clock_ts = now_str
  if not (clock_s and clock_ns and clock_s >= 0 and clock_s == floor(clock_s)
      and clock_ns >= 0 and clock_ns == floor(clock_ns) and clock_ns < 1e9) then
    return redis.error_reply('ERR decide: clock must be Unix ns digits or "redis"')
  end
  -- elapsed_ms('0', now_str), from those parts.
  now.str, now.ms = now_str, clock_s * 1000 + clock_ns / 1e6

  local head = HEADS[ARGV[3] or false] or head_of(ARGV[3])
  if not head then
    return redis.error_reply('ERR decide: bad head (requests~budgets~definitions)')
  end
  requests, budget_count, definition_count = head[1], head[2], head[3]
  if 3 + 4 * budget_count > #ARGV then
    return redis.error_reply('ERR decide: bad key budget count')
  end
  BUDGETS = budget_count > 0 and {} or NO_BUDGETS
  for b = 1, budget_count do
    local at = 3 + (b - 1) * 4
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

  local definitions, a = read_definitions(4 + 4 * budget_count, definition_count)
  if not definitions then
    return redis.error_reply(BROKEN)
  end
  -- The reply is written over the last call's (see REPLY).
  local out = REPLY
  out[1] = requests
  run_a, run_o, run_done = a, 1, 0
  while true do
    local ok, result = pcall(run, definitions)
    if ok then
      if result then
        return redis.error_reply(result)
      end
      break
    end
    if not run_after then
      return redis.error_reply(error_text(result))
    end
    -- That request alone could not be decided; the run goes on from the next.
    out[run_o + 1], out[run_o + 2] = -1, error_text(result)
    run_o, run_a = run_o + 2, run_after
  end
  a = run_a
  if a ~= #ARGV + 1 then
    return redis.error_reply(BROKEN)
  end
  if SLOT_MAP then
    local map = rpcall('CLUSTER', 'SLOTS')
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
    local o = run_o
    out[o + 1], out[o + 2] = 'slots', #ranges
    o = o + 2
    for _, r in ipairs(ranges) do
      out[o + 1], out[o + 2], out[o + 3] = r[1], r[2], r[3]
      o = o + 3
    end
    run_o = o
  end
  -- The reply ends at the first nil: Redis reads a table up to there, and what a longer
  -- reply left after it is never read.
  out[run_o + 1] = nil
  return out
end
