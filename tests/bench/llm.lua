-- wrk script for the scenarios on the OpenAI-compatible test upstream: every request is a
-- chat completion POSTed as JSON. Arguments: "json" or "stream" (a streamed answer whose
-- last event carries the usage), the API key, the usage the upstream answers with.
-- The request is formatted once (wrk.init formats it after init()). Prints the summary like
-- summary.lua.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "summary.lua")

init = function(args)
  local stream = args[1] == "stream"
  wrk.method = "POST"
  wrk.path = "/v1/chat/completions"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["x-api-key"] = args[2] or "bench-client"
  wrk.headers["x-test-usage"] = args[3] or "100"
  if stream then
    wrk.body = '{"model":"gpt-test","stream":true,"stream_options":{"include_usage":true},'
      .. '"messages":[{"role":"user","content":"Say hello."}]}'
  else
    wrk.body = '{"model":"gpt-test","messages":[{"role":"user","content":"Say hello."}]}'
  end
end
