-- Token bucket: `burst` tokens at most, refilled continuously at `limit` per `window`.
-- Smooth: a client that waits gets tokens back gradually; a full bucket allows a burst.
--
-- State (a hash at the limit's key):
--   tokens  tokens left after the last decision, passed to Redis as a number, which writes
--           it exactly (%.17g in Redis 7.0, the shortest text that reads back the same after)
--   ts      Unix ns of the last decision, stored exactly as given, never moved back
-- Memory: one small hash per key. Expires once the bucket would be full again, + 60 s.
LOADERS.token_bucket = function()
  algorithm('token_bucket', function(key, p, now)
    local rate = p.limit / p.window -- tokens per ms
    local capacity = p.burst
    local state = rcall('HMGET', key, 'tokens', 'ts')
    local tokens = tonumber(state[1])
    local stamp = now.str
    if tokens == nil or not state[2] then
      tokens = capacity
    elseif later(now.str, state[2]) then
      tokens = min(capacity, tokens + elapsed_ms(state[2], now.str) * rate)
    else
      -- A clock that went backwards refills nothing, and the stored time stays, or the same
      -- interval would be credited twice once the clock catches up.
      stamp = state[2]
      tokens = min(capacity, tokens)
    end
    -- Refill starts at the stored time: waits count from there when this clock is behind it.
    local ahead = stamp == now.str and 0 or elapsed_ms(now.str, stamp)
    local kept_reset = ahead + (capacity - tokens) / rate
    if tokens >= p.cost then
      local left = tokens - p.cost
      return true, tokens, kept_reset, 0, left, ahead + (capacity - left) / rate,
        left, stamp, text_of(ceil(ahead + capacity / rate) + 60000)
    elseif p.cost > capacity then
      return false, tokens, kept_reset, NEVER
    end
    return false, tokens, kept_reset, ceil(ahead + (p.cost - tokens) / rate)
  end, function(key, left, stamp, ttl)
    rcall('HSET', key, 'tokens', text_of(left), 'ts', stamp)
    rcall('PEXPIRE', key, ttl)
  end)

  -- Gives back at most the cost, less what the bucket may have refilled past its capacity since
  -- the charge (then the charge no longer holds anything back): at the charge the bucket held
  -- `left`; by the latest decision t it holds at most left + rate × (t - charge), so the charge
  -- holds back at least min(cost, capacity - that).
  REFUNDS.token_bucket = function(key, p, now)
    local state = redis.call('HMGET', key, 'tokens', 'ts')
    local tokens = tonumber(state[1])
    if tokens == nil or not state[2] then
      return -- expired: the bucket is full anyway
    end
    local rate = p.limit / p.window
    local latest = later(state[2], now.str) and state[2] or now.str
    local most = p.left + math.max(0, elapsed_ms(p.charged_at, latest)) * rate
    local back = math.min(p.cost, p.burst - most)
    if back > 0 then
      redis.call('HSET', key, 'tokens', math.min(p.burst, tokens + back))
    end
  end

  -- Tokens may go below zero (debt): the refill repays it before the next request fits.
  SETTLES.token_bucket = function(key, p, now)
    local rate = p.limit / p.window
    local state = redis.call('HMGET', key, 'tokens', 'ts')
    local tokens = tonumber(state[1])
    local stamp = now.str
    if tokens == nil or not state[2] then
      if p.delta <= 0 then
        return -- a fresh bucket is full
      end
      tokens = p.burst
    elseif later(now.str, state[2]) then
      tokens = math.min(p.burst, tokens + elapsed_ms(state[2], now.str) * rate)
    else
      stamp = state[2]
      tokens = math.min(p.burst, tokens)
    end
    local left = math.min(p.burst, tokens - p.delta)
    local ahead = stamp == now.str and 0 or elapsed_ms(now.str, stamp)
    redis.call('HSET', key, 'tokens', left, 'ts', stamp)
    redis.call('PEXPIRE', key, math.ceil(ahead + (p.burst - left) / rate) + 60000)
  end

  LEASABLE.token_bucket = true
end
