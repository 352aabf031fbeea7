-- Fixed window: at most `limit` per window. Windows of p.window ms are aligned to the Unix
-- epoch so every replica agrees on their edges; calendar windows (p.calendar: a day, an ISO
-- week from Monday or a month from the 1st, at a fixed UTC offset) to midnight at that offset.
-- Cheapest, but a client can send `limit` at the end of one window and `limit` again at the
-- start of the next: up to 2 x limit within one window length.
--
-- State (a hash at the limit's key):
--   w  index of the current window (floor(now / window); calendar: days since 1970-01-01,
--      weeks since Monday 1969-12-29, or 12 x year + month - 1)
--   n  cost counted in it; above `limit` only by debt (SETTLES), which each window that
--      starts repays by `limit`
-- Memory: two numbers per key. Expires at the window's end (past the debt's windows), + 60 s.
LOADERS.fixed_window = function()

  -- Calendar arithmetic on whole numbers (exact in doubles): civil dates from day numbers and
  -- back, in the proleptic Gregorian calendar, with years counted from March (a leap day ends
  -- its year) in eras of 400 years (146097 days). The Rust twin is ratelimit_core::calendar.
  local DAY_MS = 86400000

  -- Days from 1970-01-01 to the 1st of `month` (1 to 12) of `year`.
  local function days_from_civil(year, month)
    if month <= 2 then
      year = year - 1
    end
    local era = math.floor(year / 400)
    local year_of_era = year - era * 400
    local day_of_year = math.floor((153 * ((month + 9) % 12) + 2) / 5)
    local day_of_era = year_of_era * 365 + math.floor(year_of_era / 4)
      - math.floor(year_of_era / 100) + day_of_year
    return era * 146097 + day_of_era - 719468
  end

  -- The year and month (1 to 12) of day `days` after 1970-01-01.
  local function civil_from_days(days)
    local z = days + 719468
    local era = math.floor(z / 146097)
    local doe = z - era * 146097
    local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
      - math.floor(doe / 146096)) / 365)
    local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
    local from_march = math.floor((5 * doy + 2) / 153)
    local month = from_march < 10 and from_march + 3 or from_march - 9
    return yoe + era * 400 + (month <= 2 and 1 or 0), month
  end

  -- The index of the window holding Unix ms `ms`.
  local function window_index(p, ms)
    local c = p.calendar
    if not c then
      return floor(ms / p.window)
    end
    local day = floor((ms + c.offset) / DAY_MS)
    if c.unit == 'D' then
      return day
    elseif c.unit == 'W' then
      -- Day 0 is a Thursday: day -3 is the Monday week 0 starts on.
      return floor((day + 3) / 7)
    end
    local year, month = civil_from_days(day)
    return 12 * year + month - 1
  end

  -- The Unix ms at which window `index` ends (and the next begins).
  local function window_end(p, index)
    local c = p.calendar
    if not c then
      return (index + 1) * p.window
    end
    local following = index + 1
    local day
    if c.unit == 'D' then
      day = following
    elseif c.unit == 'W' then
      day = 7 * following - 3
    else
      local year = floor(following / 12)
      day = days_from_civil(year, following - 12 * year + 1)
    end
    return day * DAY_MS - c.offset
  end

  -- The window a decision at `index` counts in and its count: the newest window seen (a clock
  -- that went backwards stays in it); a later window starts from what debt left over.
  local function fixed_window_now(index, w, n, limit)
    if w == nil then
      return index, 0
    elseif index > w then
      return index, max(0, n - limit * (index - w))
    end
    return w, n
  end

  algorithm('fixed_window', function(key, p, now)
    local index = window_index(p, now.ms)
    local state = rcall('HMGET', key, 'w', 'n')
    local w, n = tonumber(state[1]), tonumber(state[2]) or 0
    index, n = fixed_window_now(index, w, n, p.limit)
    local ends_at = window_end(p, index)
    local ends_in = max(0, ends_at - now.ms)
    -- The ms from this window's end to the end of the k-th window after it.
    local function beyond(k)
      return window_end(p, index + k) - ends_at
    end
    -- Windows after this one that debt still fills.
    local owed = max(0, ceil(n / p.limit) - 1)

    local kept = max(0, p.limit - n)
    local kept_reset = n > 0 and ends_in + beyond(owed) or 0
    if n + p.cost <= p.limit then
      return true, kept, kept_reset, 0, p.limit - n - p.cost, ends_in,
        index, n + p.cost, ceil(ends_in) + 60000
    elseif p.cost > p.limit then
      return false, kept, kept_reset, NEVER
    end
    -- Debt: each window that starts repays `limit`, until n + cost fits.
    local windows = max(1, ceil((n + p.cost - p.limit) / p.limit))
    return false, kept, kept_reset, ceil(ends_in + beyond(windows - 1))
  end, function(key, index, n, ttl)
    rcall('HSET', key, 'w', text_of(index), 'n', text_of(n))
    rcall('PEXPIRE', key, ttl)
  end)

  -- Counts are additive: the charge's window, if it is still the current one, counts cost less.
  REFUNDS.fixed_window = function(key, p, now)
    local state = redis.call('HMGET', key, 'w', 'n')
    local w, n = tonumber(state[1]), tonumber(state[2])
    if w ~= nil and n ~= nil and w == window_index(p, elapsed_ms('0', p.charged_at)) then
      redis.call('HSET', key, 'n', math.max(0, n - p.cost))
    end
  end

  SETTLES.fixed_window = function(key, p, now)
    local index = window_index(p, now.ms)
    local state = redis.call('HMGET', key, 'w', 'n')
    local w, n = tonumber(state[1]), tonumber(state[2]) or 0
    index, n = fixed_window_now(index, w, n, p.limit)
    if w == nil and p.delta <= 0 then
      return
    end
    n = math.max(0, n + p.delta)
    local ends_at = window_end(p, index)
    local ends_in = math.max(0, ends_at - now.ms)
    -- Kept until the last window the debt fills has ended.
    local owed_end = window_end(p, index + math.floor(n / p.limit))
    redis.call('HSET', key, 'w', index, 'n', n)
    redis.call('PEXPIRE', key, math.ceil(ends_in + (owed_end - ends_at)) + 60000)
  end

  LEASABLE.fixed_window = true
end
