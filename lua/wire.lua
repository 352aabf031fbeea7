-- The decision call's protocol for the decision code, generated from its one definition in
-- filter/core/src/bridge/wire.rs: do not edit; write it again with
--   cargo run -p ratelimit-core --example wire_prelude > lua/wire.lua
-- Only locals: a function library's top level runs before Redis's globals are there.

-- Each mode's name in a definition (see decide.lua's header).
local MODE_ENFORCE = 'enforce'
local MODE_SHADOW = 'shadow'
local MODE_AFTER = 'after'
local MODE_LEASE = 'lease'
local MODE_HOLD = 'hold'
local MODE_SETTLE = 'settle'
local MODE_REFUND = 'refund'
-- The values a limit adds after its cost, one argument each, by its definition's mode.
local MODE_VALUES = {enforce = 0, shadow = 0, after = 0, lease = 2, hold = 1, settle = 2, refund = 2}
-- The delta of a settle that releases a concurrency hold (the request's id after it).
local RELEASE_DELTA = -1
-- The algorithms with a burst apart from their limit.
local HAS_BURST = {token_bucket = true, gcra = true}
-- The bounds an override is checked against, as the config's (bounds.rs).
local MAX_LIMIT = 1000000000000
local MAX_LOG_LIMIT = 10000
local MAX_STATE_LIFETIME_MS = 63244800000
-- An expired override stays this long (ms) for operators to see it, then Redis removes it.
local EXPIRED_KEPT_MS = 60000
-- A limit's outcome in the reply: these bits, plus OUTCOME_QUOTA_UNIT x the override's quota.
local OUTCOME_ALLOWED = 1
local OUTCOME_OVER_BUDGET = 2
local OUTCOME_OVERRIDE = 4
local OUTCOME_BAD_OVERRIDE = 8
local OUTCOME_QUOTA_UNIT = 16
-- The fields of a call's head, of a definition's argument and of a limit's, and a key
-- index with its override's ("i:j").
local HEAD_FIELDS = '^([^~]*)~([^~]*)~([^~]*)$'
local DEFINITION_FIELDS = '^([^~]*)~([^~]*)~([^~]*)~([^~]*)~([^~]*)~([^~]*)~([^~]*)$'
local LIMIT_FIELDS = '^([^~]*)~([^~]*)~([^~]*)$'
local KEY_AND_OVERRIDE = '^(%d+):(%d+)$'
