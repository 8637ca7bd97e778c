#!lua name=pivirt_registry
--[[
  The pivirt registry: pods (= clusters) and nodes, one record each whichever API made it
  (pb.CoreRPC or pivirt.cluster.v1). Loaded by every pivirt process on (re)connect, like the
  pivirt library (functions.lua). Errors are redis.error_reply('<CODE> <message>').
]]

-- pv_registry_version(): the schema version of the registry records, so a process can refuse to
-- run against records written by an incompatible build.
redis.register_function{function_name = 'pv_registry_version', flags = {'no-writes'},
  callback = function(keys, args) return 1 end}
