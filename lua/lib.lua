-- Shared part of the decision script. The filter sends ONE script to Redis: wire.lua (the call
-- protocol's constants, generated from the Rust side), this file, then one file per
-- algorithm, then decide.lua, concatenated (see filter/core/src/lib.rs). Each
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

-- The most entries a cache the code keeps from call to call holds (see decide.lua's NUMBERS):
-- it is emptied when full.
local CACHE_MOST = 4096

local ALGORITHMS = {}

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

-- Texts read as numbers, kept from call to call: a function library's top level, and what it
-- holds, lives as long as the library (a script's is made again on every call). A worker's
-- calls repeat the same few limits, counts, indexes and clock seconds, and a table lookup
-- costs far less than tonumber of the text. Emptied when it holds CACHE_MOST entries.
local NUMBERS, numbers_held = {}, 0

-- tonumber of a text, through NUMBERS.
local function number_of(text)
  if text == nil then
    return nil
  end
  local n = NUMBERS[text]
  if n == nil then
    n = tonumber(text) or false
    if numbers_held >= CACHE_MOST then
      NUMBERS, numbers_held = {}, 0
    end
    NUMBERS[text], numbers_held = n, numbers_held + 1
  end
  return n or nil
end

-- A number as a command's argument: a whole one below 1e14 as its text, kept in WHOLE_TEXTS
-- (the same counts, window indexes and bucket levels come back from call to call, and Redis
-- would format a number argument with %.17g on every use); any other as the number, which
-- Redis writes exactly.
local WHOLE_TEXTS, whole_texts_held = {}, 0
local function text_of(x)
  local text = WHOLE_TEXTS[x]
  if text then
    return text
  end
  if x < 0 or x >= 1e14 or x ~= floor(x) then
    return x
  end
  text = tostring(x)
  if whole_texts_held >= CACHE_MOST then
    WHOLE_TEXTS, whole_texts_held = {}, 0
  end
  WHOLE_TEXTS[x], whole_texts_held = text, whole_texts_held + 1
  return text
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
