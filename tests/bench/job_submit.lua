--[[
 job_submit.lua — config (d) of tests/bench/submit_bench.sh.

 The same routing decision job_submit_fleet makes, written the way a site
 would write it in Slurm's job_submit/lua: find the GPU type a job asks for
 (any of the tres_per_* forms, "gres:" or "gres/" prefix or none), check a
 static table of which cluster has which GPU types, read a small file that
 stands in for the agent's cached fleet view, and for a job that this cluster
 cannot serve rewrite it the way the Fleet plugin does (proxy partition, GPU
 request cleared, a summary in admin_comment). Always slurm.SUCCESS.

 The benchmark copies this file beside the cluster's slurm.conf (where
 job_submit/lua looks for it) and replaces @SITE@ and @VIEW_FILE@.
--]]

local SITE = "@SITE@"
local VIEW_FILE = "@VIEW_FILE@"
local PROXY_PARTITION = "fleet"

-- Which GPU types each cluster has (the static part of the fleet view).
local CLUSTER_GPUS = {
  alpha = { h100 = 16 },
  beta  = { a100 = 16 },
}

local TRES_FIELDS = { "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket" }

-- "gres:gpu:h100:8", "gres/gpu:h100:8", "gpu:h100:8", "gpu:8", "gpu"
-- → type ("h100" or nil), count
local function parse_gpu_item(item)
  local s = item:gsub("^gres[:/]", "")
  local name, rest = s:match("^([%w_]+):?(.*)$")
  if name ~= "gpu" then return nil end
  if rest == "" then return false, 1 end
  local typ, cnt = rest:match("^([%a][%w_%-]*):(%d+)$")
  if typ then return typ, tonumber(cnt) end
  cnt = rest:match("^(%d+)$")
  if cnt then return false, tonumber(cnt) end
  typ = rest:match("^([%a][%w_%-]*)$")
  if typ then return typ, 1 end
  return nil
end

local function requested_gpu(job_desc)
  for _, field in ipairs(TRES_FIELDS) do
    local v = job_desc[field]
    if v ~= nil and v ~= "" then
      for item in string.gmatch(v, "[^,]+") do
        local typ, cnt = parse_gpu_item(item)
        if typ ~= nil then return typ, cnt, field, v end
      end
    end
  end
  return nil
end

-- The "cached view": a small file the agent would keep current.
local function read_view()
  local f = io.open(VIEW_FILE, "r")
  if f == nil then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local typ, cnt, field, raw = requested_gpu(job_desc)
  if not typ then
    return slurm.SUCCESS          -- no GPU type asked for: LOCAL
  end
  local home = CLUSTER_GPUS[SITE] or {}
  if home[typ] then
    return slurm.SUCCESS          -- this cluster has the type: LOCAL
  end
  local view = read_view()
  local target = nil
  for cluster, gpus in pairs(CLUSTER_GPUS) do
    if cluster ~= SITE and gpus[typ] and gpus[typ] >= cnt then
      if view == nil or view:find(cluster .. " up", 1, true) then
        target = cluster
        break
      end
    end
  end
  if target == nil then
    return slurm.SUCCESS          -- nowhere better: stay (fail open)
  end
  -- FORWARD: rewrite into a stand-in, like job_submit_fleet.
  job_desc.partition = PROXY_PARTITION
  job_desc.admin_comment = string.format("fleet: %s=%s -> %s", field, raw, target)
  job_desc[field] = ""
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

slurm.log_info("job_submit.lua (fleet bench, site %s) loaded", SITE)
return slurm.SUCCESS
