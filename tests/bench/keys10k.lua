-- wrk script for filter-allow-10k-keys: each request carries the API key of one of N clients
-- (N = first script argument, default 10000), every thread cycling through all of them from
-- its own starting point. The requests are formatted once in init(), so request() costs wrk
-- a table lookup. Prints the summary like summary.lua.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "summary.lua")

local requests = {}
local next_index = 0
local threads = 0

-- Runs in the main state before the threads start: gives each thread its number.
setup = function(thread)
  threads = threads + 1
  thread:set("thread_number", threads)
end

init = function(args)
  local n = tonumber(args[1]) or 10000
  for k = 1, n do
    requests[k] = wrk.format("GET", "/", { ["x-api-key"] = "client-" .. k })
  end
  -- Threads start far apart in the key space.
  next_index = ((thread_number or 1) - 1) * 4999 % n
end

request = function()
  next_index = next_index % #requests + 1
  return requests[next_index]
end
