-- Fixed window: at most `limit` per window, windows aligned to the Unix epoch so every
-- replica agrees on their edges. Cheapest, but a client can send `limit` at the end of one
-- window and `limit` again at the start of the next: up to 2 x limit within one window length.
--
-- State (a hash at the limit's key):
--   w  index of the current window (floor(now / window))
--   n  cost counted in it; above `limit` only by debt (SETTLES), which each window that
--      starts repays by `limit`
-- Memory: two numbers per key. Expires at the window's end (past the debt's windows), + 60 s.
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

ALGORITHMS.fixed_window = function(key, p, now)
  local index = math.floor(now.ms / p.window)
  local state = redis.call('HMGET', key, 'w', 'n')
  local w, n = tonumber(state[1]), tonumber(state[2]) or 0
  index, n = fixed_window_now(index, w, n, p.limit)
  local ends_in = math.max(0, (index + 1) * p.window - now.ms)
  -- Windows after this one that debt still fills.
  local owed = math.max(0, math.ceil(n / p.limit) - 1)

  local d = {
    allowed = n + p.cost <= p.limit,
    kept_remaining = math.max(0, p.limit - n),
    kept_reset = n > 0 and ends_in + owed * p.window or 0,
    retry = 0,
  }
  if d.allowed then
    d.taken_remaining = p.limit - n - p.cost
    d.taken_reset = ends_in
    d.commit = function()
      redis.call('HSET', key, 'w', index, 'n', n + p.cost)
      redis.call('PEXPIRE', key, math.ceil(ends_in) + 60000)
    end
  else
    -- A cost above the limit never fits; the next window is the earliest honest answer.
    -- Debt: each window that starts repays `limit`, until n + cost fits.
    local windows = p.cost > p.limit and 1 or math.max(1, math.ceil((n + p.cost - p.limit) / p.limit))
    d.retry = math.ceil(ends_in + (windows - 1) * p.window)
  end
  return d
end

-- Counts are additive: the charge's window, if it is still the current one, counts cost less.
REFUNDS.fixed_window = function(key, p, now)
  local state = redis.call('HMGET', key, 'w', 'n')
  local w, n = tonumber(state[1]), tonumber(state[2])
  if w ~= nil and n ~= nil and w == math.floor(elapsed_ms('0', p.charged_at) / p.window) then
    redis.call('HSET', key, 'n', math.max(0, n - p.cost))
  end
end

SETTLES.fixed_window = function(key, p, now)
  local index = math.floor(now.ms / p.window)
  local state = redis.call('HMGET', key, 'w', 'n')
  local w, n = tonumber(state[1]), tonumber(state[2]) or 0
  index, n = fixed_window_now(index, w, n, p.limit)
  if w == nil and p.delta <= 0 then
    return
  end
  n = math.max(0, n + p.delta)
  local ends_in = math.max(0, (index + 1) * p.window - now.ms)
  redis.call('HSET', key, 'w', index, 'n', n)
  redis.call('PEXPIRE', key, math.ceil(ends_in + math.floor(n / p.limit) * p.window) + 60000)
end

LEASABLE.fixed_window = true
