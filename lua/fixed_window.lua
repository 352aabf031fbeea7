-- Fixed window: at most `limit` per window, windows aligned to the Unix epoch so every
-- replica agrees on their edges. Cheapest, but a client can send `limit` at the end of one
-- window and `limit` again at the start of the next: up to 2 x limit within one window length.
--
-- State (a hash at the limit's key):
--   w  index of the current window (floor(now / window))
--   n  cost counted in it
-- Memory: two numbers per key. Expires at the window's end, + 60 s.
ALGORITHMS.fixed_window = function(key, p, now)
  local index = math.floor(now.ms / p.window)
  local state = redis.call('HMGET', key, 'w', 'n')
  local w, n = tonumber(state[1]), tonumber(state[2]) or 0
  if w == nil or index > w then
    n = 0
  else
    index = w -- a clock that went backwards stays in the newest window seen
  end
  local ends_in = math.max(0, (index + 1) * p.window - now.ms)

  local d = {
    allowed = n + p.cost <= p.limit,
    kept_remaining = math.max(0, p.limit - n),
    kept_reset = n > 0 and ends_in or 0,
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
    d.retry = math.ceil(ends_in)
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

LEASABLE.fixed_window = true
