-- Shared part of the decision code. The filter sends Redis ONE text: this file, one file per
-- algorithm, wire.lua (the call protocol's constants, generated from the Rust side), then
-- decide.lua, concatenated (see DECISION_CODE in filter/core/src/lib.rs). Each algorithm file
-- is a loader (LOADERS below) that adds a function to ALGORITHMS:
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
-- The globals the hot paths call (the call's head, the fast request, the algorithms' decisions
-- and charges, the clock), as locals: a function library's code reaches a global through its
-- environment's metatable on every use, a local at once. The other functions call the globals:
-- a script builds every function on each call, and each local a function uses costs its
-- building more than a global costs a cold path. A library's top level runs before Redis's
-- globals are there (only `redis` is), so they are taken at the first call: decide calls
-- localize when `floor` is still nil (a script's top level runs on every call, and so does
-- localize).
local floor, ceil, max, min, huge, format, sub, match, rcall, rpcall
local function localize()
  floor, ceil, max, min, huge = math.floor, math.ceil, math.max, math.min, math.huge
  format, sub, match = string.format, string.sub, string.match
  rcall, rpcall = redis.call, redis.pcall
end

-- Caches: what the code read or wrote once and finds again. A function library's top level,
-- and what it holds, lives as long as the library, and a worker's calls repeat the same few
-- heads, definitions, limits, counts and clock seconds: a table lookup costs far less than
-- reading the text again. A script's top level is made again on every call (LIBRARY false),
-- so its caches serve one call: only those whose entries repeat within a call are filled
-- there. A library's cache is emptied when it holds CACHE_MOST entries (a script's holds no
-- more than its call brings).
local CACHE_MOST = 4096
local HELD = {}

-- Keeps value at key in cache and returns it: what each cache does on a miss. A cache whose
-- entries serve later calls only (across) keeps nothing in a script.
local function keep(cache, key, value, across)
  if not LIBRARY then
    if not across then
      cache[key] = value
    end
    return value
  end
  local held = HELD[cache] or 0
  if held >= CACHE_MOST then
    for k in pairs(cache) do
      cache[k] = nil
    end
    held = 0
  end
  cache[key], HELD[cache] = value, held + 1
  return value
end

local ALGORITHMS = {}

-- LOADERS.name = function(): defines the algorithm's functions (each algorithm file is one
-- loader), run at the algorithm's first use (load_algorithm, when a definition names it). A
-- script's top level runs on every call: building every algorithm's functions for a call that
-- uses one would cost it more than its deciding. A library loads each algorithm once.
local LOADERS = {}
local function load_algorithm(name)
  local load = LOADERS[name]
  if load then
    LOADERS[name] = nil
    load()
  end
end

-- DECIDE_ALONE.name = {decide, charge}: the algorithm's two functions (below), which
-- decide.lua's fast path calls itself: the decision of a request of that one limit, its state
-- charged at once when it allows, with no table made. An algorithm gets both views from one
-- decision function through `algorithm` below.
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
  DECIDE_ALONE[name] = {decide, charge}
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

-- Texts read as numbers (a cache across calls; false for a text that is not one).
local NUMBERS = {}

-- tonumber of a text, through NUMBERS in a library (a script reads each text: the few that
-- repeat within a call cost less than the cache would).
local number_of = not LIBRARY and tonumber or function(text)
  if text == nil then
    return nil
  end
  local n = NUMBERS[text]
  if n == nil then
    n = keep(NUMBERS, text, tonumber(text) or false, true)
  end
  return n or nil
end

-- A number as a command's argument: a whole one below 1e14 as its text, kept in WHOLE_TEXTS
-- (a cache: the same counts, window indexes and bucket levels come back from request to
-- request, and Redis would format a number argument with %.17g on every use); any other as
-- the number, which Redis writes exactly.
local WHOLE_TEXTS = {}
local function text_of(x)
  local text = WHOLE_TEXTS[x]
  if text then
    return text
  end
  if x < 0 or x >= 1e14 or x ~= floor(x) then
    return x
  end
  return keep(WHOLE_TEXTS, x, tostring(x))
end

-- Exact milliseconds from ns string a to ns string b: ns timestamps (~1.8e18) do not fit a
-- double, so seconds and nanoseconds are subtracted separately.
-- The call's own clock is split once (decide sets clock_ts, clock_s, clock_ns): nearly every
-- elapsed_ms has it on one side.
local clock_ts, clock_s, clock_ns
local function split(ts)
  if ts == clock_ts then
    return clock_s, clock_ns
  end
  if #ts <= 9 then
    return 0, tonumber(ts)
  end
  -- Seconds repeat from call to call (NUMBERS); the ns within the second seldom do.
  return number_of(sub(ts, 1, -10)), tonumber(sub(ts, -9))
end


local function elapsed_ms(a, b)
  local as, ans = split(a)
  local bs, bns = split(b)
  return (bs - as) * 1000 + (bns - ans) / 1e6
end
