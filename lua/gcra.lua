-- GCRA (generic cell rate algorithm): the token bucket's behaviour from one number, the
-- "theoretical arrival time" (TAT) of the next request. One request is due every
-- T = window / limit; a request may come up to `burst` intervals early.
--
-- State (a hash at the limit's key):
--   tat  theoretical arrival time, Unix ms (a number Redis writes exactly, as tokens)
-- Memory: one number per key. Expires when TAT has passed (the key would be fresh), + 60 s.
LOADERS.gcra = function()
  algorithm('gcra', function(key, p, now)
    local interval = p.window / p.limit
    local stored = tonumber(rcall('HGET', key, 'tat'))
    -- A clock that went backwards cannot move TAT back.
    local tat = max(stored or now.ms, now.ms)
    local new_tat = tat + p.cost * interval
    local allow_at = new_tat - p.burst * interval
    local kept = max(0, (now.ms - (tat - p.burst * interval)) / interval)
    if now.ms >= allow_at then
      return true, kept, tat - now.ms, 0, max(0, (now.ms - allow_at) / interval),
        new_tat - now.ms, new_tat, ceil(new_tat - now.ms) + 60000
    elseif p.cost > p.burst then
      return false, kept, tat - now.ms, NEVER -- even at TAT = now, more than burst intervals early
    end
    return false, kept, tat - now.ms, ceil(allow_at - now.ms)
  end, function(key, new_tat, ttl)
    rcall('HSET', key, 'tat', new_tat)
    rcall('PEXPIRE', key, ttl)
  end)

  -- Moves TAT back by at most cost intervals, less the time the clock may have passed the TAT
  -- this limit would have had without the charge (there the charge stopped holding anything
  -- back). now is the refund's clock plus the allowed clock skew: no replica decided later.
  REFUNDS.gcra = function(key, p, now)
    local stored = tonumber(redis.call('HGET', key, 'tat'))
    if stored == nil then
      return
    end
    local interval = p.window / p.limit
    local charged_ms = elapsed_ms('0', p.charged_at)
    -- The TAT the charge wrote, from what it replied: left = (charge - (tat - burst × T)) / T.
    local without = charged_ms + (p.burst - p.left) * interval - p.cost * interval
    local back = p.cost * interval - math.max(0, now.ms - without)
    if back > 0 then
      redis.call('HSET', key, 'tat', stored - back)
    end
  end

  -- Debt moves TAT further ahead than burst intervals; a give-back moves it back, never before
  -- now (a TAT in the past is a full allowance already).
  SETTLES.gcra = function(key, p, now)
    local interval = p.window / p.limit
    local stored = tonumber(redis.call('HGET', key, 'tat'))
    if stored == nil and p.delta <= 0 then
      return
    end
    local tat = math.max(stored or now.ms, now.ms)
    local new_tat = math.max(now.ms, tat + p.delta * interval)
    redis.call('HSET', key, 'tat', new_tat)
    redis.call('PEXPIRE', key, math.ceil(new_tat - now.ms) + 60000)
  end

  LEASABLE.gcra = true
end
