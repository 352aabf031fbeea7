-- Sliding window log: the time of every counted request in a sorted set, so the count over
-- the last `window` is exact at every instant. Memory grows with the limit (one entry per
-- unit of cost in the window), so keep it for small limits: login attempts, SMS, payments.
--
-- State (a sorted set at the limit's key):
--   score   Unix ms of the request
--   member  "<now ns>:<redis time us>:<i>", unique even for equal client clocks
-- Memory: up to `limit` entries per key. Expires one window after the newest entry, + 60 s.
LOADERS.sliding_window_log = function()
  ALGORITHMS.sliding_window_log = function(key, p, now)
    -- Entries at or before now - window no longer count.
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.17g', now.ms - p.window))
    local count = redis.call('ZCARD', key)
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    local kept_reset = 0
    if newest[2] then
      kept_reset = math.max(0, tonumber(newest[2]) + p.window - now.ms)
    end

    local d = {
      allowed = count + p.cost <= p.limit,
      kept_remaining = math.max(0, p.limit - count),
      kept_reset = kept_reset,
      retry = 0,
    }
    if d.allowed then
      d.taken_remaining = p.limit - count - p.cost
      d.taken_reset = p.window
      d.commit = function()
        local t = redis.call('TIME')
        local score = string.format('%.17g', now.ms)
        for i = 1, p.cost do
          redis.call('ZADD', key, score, now.str .. ':' .. t[1] .. t[2] .. ':' .. i)
        end
        redis.call('PEXPIRE', key, math.ceil(p.window) + 60000)
      end
    elseif p.cost > p.limit then
      d.retry = NEVER
    else
      -- The request fits once the (count + cost - limit) oldest entries have left the window.
      local k = count + p.cost - p.limit
      local entry = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
      d.retry = math.max(1, math.ceil(tonumber(entry[2]) + p.window - now.ms))
    end
    return d
  end

  -- Removes cost entries of the charge's instant: entries with one score are interchangeable
  -- units (requests of one batch share the clock), so which of them go does not matter.
  REFUNDS.sliding_window_log = function(key, p, now)
    local score = string.format('%.17g', elapsed_ms('0', p.charged_at))
    local entries = redis.call('ZRANGE', key, score, score, 'BYSCORE', 'LIMIT', 0, p.cost)
    if #entries > 0 then
      redis.call('ZREM', key, unpack(entries))
    end
  end
end
