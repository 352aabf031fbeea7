-- Concurrency: at most `limit` requests of an identity in flight at once, across every
-- replica. Each admitted request takes a hold until its stream ends (the filter then sends a
-- release: mode "settle" with the request's id) or, when no release comes (a proxy that
-- died, a call lost in an outage), until its own deadline: `max_duration` (the window
-- argument) after it was admitted. No hold outlives its deadline.
--
-- State (a sorted set at the limit's key):
--   member  the request's id, p.member ("<worker>-<stream>", unique per proxy worker)
--   score   Unix ms at which its hold ends itself (admission + max_duration)
-- Memory: one entry per request in flight. Expires max_duration after the newest admission,
-- + 60 s. A request takes one hold whatever its cost.
LOADERS.concurrency = function()
  ALGORITHMS.concurrency = function(key, p, now)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.17g', now.ms))
    local held = redis.call('ZCARD', key)
    local d = {
      allowed = held < p.limit,
      kept_remaining = math.max(0, p.limit - held),
      kept_reset = 0,
      retry = 0,
    }
    if d.allowed then
      d.taken_remaining = p.limit - held - 1
      d.taken_reset = 0
      d.commit = function()
        redis.call('ZADD', key, string.format('%.17g', now.ms + p.window), p.member)
        redis.call('PEXPIRE', key, text_of(math.ceil(p.window) + 60000))
      end
    else
      -- A hold ends whenever a request in flight ends, and at the latest at the oldest
      -- admission's deadline: retry within a second, or by then if sooner.
      local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      local latest = oldest[2] and math.max(1, math.ceil(tonumber(oldest[2]) - now.ms)) or 1
      d.kept_reset = latest
      d.retry = math.min(1000, latest)
    end
    return d
  end

  -- A release: the request's stream ended (or another slot refused it), its hold ends now.
  SETTLES.concurrency = function(key, p, now)
    redis.call('ZREM', key, p.member)
  end
end
