-- Sliding window counter: the fixed window's two counters (this window and the previous
-- one), with the previous one weighted by how much of it still overlaps the sliding window.
-- Nearly exact (it assumes the previous window's requests were spread evenly), no boundary
-- burst, constant memory.
--
-- State (a hash at the limit's key):
--   w     index of the current window
--   cur   cost counted in window w
--   prev  cost counted in window w - 1
-- Memory: three numbers per key. Expires when both windows are out of reach, + 60 s.
LOADERS.sliding_window_counter = function()
  algorithm('sliding_window_counter', function(key, p, now)
    local W = p.window
    local index = floor(now.ms / W)
    local state = rcall('HMGET', key, 'w', 'cur', 'prev')
    local w, cur, prev = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
    local into = now.ms - index * W
    if w == nil or index > w + 1 then
      cur, prev = 0, 0
    elseif index == w + 1 then
      cur, prev = 0, cur
    elseif index < w then
      index, into = w, 0 -- a clock that went backwards: the newest window, fully weighted
    end
    local weight = (W - into) / W
    local estimate = prev * weight + cur
    -- Time until the estimate drops to `target` or less, or nil if it never does on its own.
    local function wait_for(target)
      if estimate <= target then return 0 end
      if cur <= target and prev > 0 then
        -- Within this window: prev * (W - t) / W + cur <= target.
        return max(0, W - (target - cur) * W / prev - into)
      end
      if target < 0 then return nil end
      -- Next window: cur becomes prev and decays from the next window's start.
      return (W - into) + max(0, W - target * W / cur)
    end

    local kept = max(0, p.limit - estimate)
    if estimate + p.cost <= p.limit then
      return true, kept, wait_for(0), 0, max(0, p.limit - estimate - p.cost), (W - into) + W,
        index, cur + p.cost, prev, ceil(2 * W - into) + 60000
    elseif p.cost > p.limit then
      return false, kept, wait_for(0), NEVER
    end
    return false, kept, wait_for(0), ceil(wait_for(p.limit - p.cost) or (2 * W - into))
  end, function(key, index, cur, prev, ttl)
    rcall('HSET', key, 'w', text_of(index), 'cur', text_of(cur), 'prev', text_of(prev))
    rcall('PEXPIRE', key, ttl)
  end)

  -- Counts are additive: the charge's window counts cost less, whether it is still the current
  -- window or has become the previous one.
  REFUNDS.sliding_window_counter = function(key, p, now)
    local state = redis.call('HMGET', key, 'w', 'cur', 'prev')
    local w, cur, prev = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
    local charged = math.floor(elapsed_ms('0', p.charged_at) / p.window)
    if w == charged then
      redis.call('HSET', key, 'cur', math.max(0, cur - p.cost))
    elseif w == charged + 1 then
      redis.call('HSET', key, 'prev', math.max(0, prev - p.cost))
    end
  end

  -- Debt counts in the current window like a charge: it weighs on the next window as the
  -- previous one, and is forgotten once both windows have passed (at most two windows of debt).
  -- A give-back takes from the current window's count first, then from the previous one's.
  SETTLES.sliding_window_counter = function(key, p, now)
    local W = p.window
    local index = math.floor(now.ms / W)
    local state = redis.call('HMGET', key, 'w', 'cur', 'prev')
    local w, cur, prev = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
    if w == nil or index > w + 1 then
      if p.delta <= 0 then
        return
      end
      cur, prev = 0, 0
    elseif index == w + 1 then
      cur, prev = 0, cur
    elseif index < w then
      index = w
    end
    if p.delta >= 0 then
      cur = cur + p.delta
    else
      local back = -p.delta
      local from_cur = math.min(cur, back)
      cur, prev = cur - from_cur, math.max(0, prev - (back - from_cur))
    end
    local into = math.max(0, now.ms - index * W)
    redis.call('HSET', key, 'w', index, 'cur', cur, 'prev', prev)
    redis.call('PEXPIRE', key, math.ceil(2 * W - into) + 60000)
  end
end
