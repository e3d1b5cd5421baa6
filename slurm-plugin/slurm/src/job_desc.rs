//! Typed access to slurmctld's `job_desc_msg_t` during `job_submit`.
//!
//! Reads copy out (lossily for bytes that are not UTF-8, reporting which
//! fields were); writes free the old string with Slurm's allocator and
//! store a new one from it.

use std::borrow::Cow;
use std::ffi::{c_char, CStr};

use crate::alloc;
use crate::sys::job_desc_msg_t;

/// The string fields Fleet reads or rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrField {
    Account,
    AdminComment,
    ArrayInx,
    Comment,
    CpusPerTres,
    Dependency,
    ExcNodes,
    Features,
    MemPerTres,
    Name,
    Partition,
    ReqNodes,
    Script,
    StdErr,
    StdOut,
    TresBind,
    TresFreq,
    TresPerJob,
    TresPerNode,
    TresPerSocket,
    TresPerTask,
    WorkDir,
    BurstBuffer,
    Container,
    Licenses,
    MailUser,
    McsLabel,
    Network,
    Prefer,
    Qos,
    Reservation,
    SubmitLine,
    Wckey,
    CpuBind,
    MemBind,
    StdIn,
    AcctgFreq,
}

impl StrField {
    pub fn name(self) -> &'static str {
        match self {
            StrField::Account => "account",
            StrField::AdminComment => "admin_comment",
            StrField::ArrayInx => "array_inx",
            StrField::Comment => "comment",
            StrField::CpusPerTres => "cpus_per_tres",
            StrField::Dependency => "dependency",
            StrField::ExcNodes => "exc_nodes",
            StrField::Features => "features",
            StrField::MemPerTres => "mem_per_tres",
            StrField::Name => "name",
            StrField::Partition => "partition",
            StrField::ReqNodes => "req_nodes",
            StrField::Script => "script",
            StrField::StdErr => "std_err",
            StrField::StdOut => "std_out",
            StrField::TresBind => "tres_bind",
            StrField::TresFreq => "tres_freq",
            StrField::TresPerJob => "tres_per_job",
            StrField::TresPerNode => "tres_per_node",
            StrField::TresPerSocket => "tres_per_socket",
            StrField::TresPerTask => "tres_per_task",
            StrField::WorkDir => "work_dir",
            StrField::BurstBuffer => "burst_buffer",
            StrField::Container => "container",
            StrField::Licenses => "licenses",
            StrField::MailUser => "mail_user",
            StrField::McsLabel => "mcs_label",
            StrField::Network => "network",
            StrField::Prefer => "prefer",
            StrField::Qos => "qos",
            StrField::Reservation => "reservation",
            StrField::SubmitLine => "submit_line",
            StrField::Wckey => "wckey",
            StrField::CpuBind => "cpu_bind",
            StrField::MemBind => "mem_bind",
            StrField::StdIn => "std_in",
            StrField::AcctgFreq => "acctg_freq",
        }
    }
}

/// Numeric fields (all widened to u64; Slurm's NO_VAL markers kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumField {
    UserId,
    GroupId,
    MinNodes,
    MaxNodes,
    NumTasks,
    NtasksPerNode,
    CpusPerTask,
    MinCpus,
    TimeLimit,
    TimeMin,
    PnMinMemory,
    PnMinCpus,
    Shared,
    Contiguous,
    SocketsPerNode,
    CoresPerSocket,
    ThreadsPerCore,
    NtasksPerSocket,
    NtasksPerCore,
    NtasksPerTres,
    MailType,
    WarnFlags,
    WarnSignal,
    WarnTime,
    CoreSpec,
    ReqSwitch,
    HetJobOffset,
    Bitflags,
    PnMinTmpDisk,
    Overcommit,
    CpuFreqMin,
    CpuFreqMax,
    CpuFreqGov,
    Requeue,
    KillOnNodeFail,
    DelayBoot,
    Reboot,
    Deadline,
    BeginTime,
    Immediate,
    /// `priority`: 0 for `--hold` (`NO_VAL` when not given).
    Priority,
    Wait4Switch,
    Profile,
    PowerFlags,
    WaitAllNodes,
    TaskDist,
}

/// A `job_desc_msg_t` borrowed from slurmctld for the duration of one hook.
pub struct JobDesc<'a> {
    raw: &'a mut job_desc_msg_t,
}

impl<'a> JobDesc<'a> {
    /// # Safety
    /// `ptr` must be the non-NULL `job_desc` slurmctld passed to the hook,
    /// valid and exclusively ours until the hook returns.
    pub unsafe fn from_raw(ptr: *mut job_desc_msg_t) -> Option<JobDesc<'a>> {
        // SAFETY: per the contract above.
        unsafe { ptr.as_mut() }.map(|raw| JobDesc { raw })
    }

    #[inline]
    fn slot(&mut self, f: StrField) -> &mut *mut c_char {
        let r = &mut *self.raw;
        match f {
            StrField::Account => &mut r.account,
            StrField::AdminComment => &mut r.admin_comment,
            StrField::ArrayInx => &mut r.array_inx,
            StrField::Comment => &mut r.comment,
            StrField::CpusPerTres => &mut r.cpus_per_tres,
            StrField::Dependency => &mut r.dependency,
            StrField::ExcNodes => &mut r.exc_nodes,
            StrField::Features => &mut r.features,
            StrField::MemPerTres => &mut r.mem_per_tres,
            StrField::Name => &mut r.name,
            StrField::Partition => &mut r.partition,
            StrField::ReqNodes => &mut r.req_nodes,
            StrField::Script => &mut r.script,
            StrField::StdErr => &mut r.std_err,
            StrField::StdOut => &mut r.std_out,
            StrField::TresBind => &mut r.tres_bind,
            StrField::TresFreq => &mut r.tres_freq,
            StrField::TresPerJob => &mut r.tres_per_job,
            StrField::TresPerNode => &mut r.tres_per_node,
            StrField::TresPerSocket => &mut r.tres_per_socket,
            StrField::TresPerTask => &mut r.tres_per_task,
            StrField::WorkDir => &mut r.work_dir,
            StrField::BurstBuffer => &mut r.burst_buffer,
            StrField::Container => &mut r.container,
            StrField::Licenses => &mut r.licenses,
            StrField::MailUser => &mut r.mail_user,
            StrField::McsLabel => &mut r.mcs_label,
            StrField::Network => &mut r.network,
            StrField::Prefer => &mut r.prefer,
            StrField::Qos => &mut r.qos,
            StrField::Reservation => &mut r.reservation,
            StrField::SubmitLine => &mut r.submit_line,
            StrField::Wckey => &mut r.wckey,
            StrField::CpuBind => &mut r.cpu_bind,
            StrField::MemBind => &mut r.mem_bind,
            StrField::StdIn => &mut r.std_in,
            StrField::AcctgFreq => &mut r.acctg_freq,
        }
    }

    /// The field's bytes, or `None` when NULL.
    #[inline]
    pub fn bytes(&mut self, f: StrField) -> Option<&[u8]> {
        let p = *self.slot(f);
        if p.is_null() {
            return None;
        }
        // SAFETY: non-NULL job_desc strings are NUL-terminated C strings
        // owned by slurmctld for at least the duration of the hook; the
        // returned slice borrows `self`, so it cannot outlive a rewrite.
        Some(unsafe { CStr::from_ptr(p) }.to_bytes())
    }

    /// The field as text; bytes that are not UTF-8 are replaced (the
    /// caller can check [`JobDesc::is_utf8`]).
    #[inline]
    pub fn get(&mut self, f: StrField) -> Option<Cow<'_, str>> {
        self.bytes(f).map(String::from_utf8_lossy)
    }

    pub fn is_utf8(&mut self, f: StrField) -> bool {
        self.bytes(f).is_none_or(|b| std::str::from_utf8(b).is_ok())
    }

    /// Replace the field (`None` = NULL), freeing the old value with Slurm's allocator.
    pub fn set(&mut self, f: StrField, value: Option<&str>) {
        let slot: *mut *mut c_char = self.slot(f);
        // SAFETY: the slot holds NULL or a string from Slurm's allocator
        // (slurmctld unpacked it with xmalloc); xfree clears it.
        unsafe { alloc::xfree(slot) };
        if let Some(v) = value {
            // SAFETY: `slot` points into the job_desc we exclusively borrow.
            unsafe { *slot = alloc::xstrdup(v) };
        }
    }

    #[inline]
    pub fn num(&self, f: NumField) -> u64 {
        let r = &*self.raw;
        match f {
            NumField::UserId => r.user_id.into(),
            NumField::GroupId => r.group_id.into(),
            NumField::MinNodes => r.min_nodes.into(),
            NumField::MaxNodes => r.max_nodes.into(),
            NumField::NumTasks => r.num_tasks.into(),
            NumField::NtasksPerNode => r.ntasks_per_node.into(),
            NumField::CpusPerTask => r.cpus_per_task.into(),
            NumField::MinCpus => r.min_cpus.into(),
            NumField::TimeLimit => r.time_limit.into(),
            NumField::TimeMin => r.time_min.into(),
            NumField::PnMinMemory => r.pn_min_memory,
            NumField::PnMinCpus => r.pn_min_cpus.into(),
            NumField::Shared => r.shared.into(),
            NumField::Contiguous => r.contiguous.into(),
            NumField::SocketsPerNode => r.sockets_per_node.into(),
            NumField::CoresPerSocket => r.cores_per_socket.into(),
            NumField::ThreadsPerCore => r.threads_per_core.into(),
            NumField::NtasksPerSocket => r.ntasks_per_socket.into(),
            NumField::NtasksPerCore => r.ntasks_per_core.into(),
            NumField::NtasksPerTres => r.ntasks_per_tres.into(),
            NumField::MailType => r.mail_type.into(),
            NumField::WarnFlags => r.warn_flags.into(),
            NumField::WarnSignal => r.warn_signal.into(),
            NumField::WarnTime => r.warn_time.into(),
            NumField::CoreSpec => r.core_spec.into(),
            NumField::ReqSwitch => r.req_switch.into(),
            NumField::HetJobOffset => r.het_job_offset.into(),
            NumField::Bitflags => r.bitflags,
            NumField::PnMinTmpDisk => r.pn_min_tmp_disk.into(),
            NumField::Overcommit => r.overcommit.into(),
            NumField::CpuFreqMin => r.cpu_freq_min.into(),
            NumField::CpuFreqMax => r.cpu_freq_max.into(),
            NumField::CpuFreqGov => r.cpu_freq_gov.into(),
            NumField::Requeue => r.requeue.into(),
            NumField::KillOnNodeFail => r.kill_on_node_fail.into(),
            NumField::DelayBoot => r.delay_boot.into(),
            NumField::Reboot => r.reboot.into(),
            NumField::Deadline => r.deadline as u64,
            NumField::BeginTime => r.begin_time as u64,
            NumField::Immediate => r.immediate.into(),
            NumField::Priority => r.priority.into(),
            NumField::Wait4Switch => r.wait4switch.into(),
            NumField::Profile => r.profile.into(),
            NumField::PowerFlags => crate::sys::job_desc_power_flags(r).into(),
            NumField::WaitAllNodes => r.wait_all_nodes.into(),
            NumField::TaskDist => r.task_dist.into(),
        }
    }

    /// The job an update names (`job_modify`, `scontrol update JobId=N`):
    /// `job_id`, else the leading number of `job_id_str` (an array task's
    /// `N_T` or a het component's `N+C` gives N). `None` at submission.
    pub fn job_id(&self) -> Option<u32> {
        let r = &*self.raw;
        if r.job_id != 0 && r.job_id != crate::NO_VAL {
            return Some(r.job_id);
        }
        if r.job_id_str.is_null() {
            return None;
        }
        // SAFETY: slurmctld's strings are NUL-terminated and live for the hook.
        let s = unsafe { std::ffi::CStr::from_ptr(r.job_id_str) }.to_bytes();
        let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
        std::str::from_utf8(&s[..digits]).ok()?.parse().ok().filter(|&id| id != 0)
    }

    /// Set a numeric field; values are truncated to the field's width.
    pub fn set_num(&mut self, f: NumField, v: u64) {
        let r = &mut *self.raw;
        match f {
            NumField::UserId => r.user_id = v as u32,
            NumField::GroupId => r.group_id = v as u32,
            NumField::MinNodes => r.min_nodes = v as u32,
            NumField::MaxNodes => r.max_nodes = v as u32,
            NumField::NumTasks => r.num_tasks = v as u32,
            NumField::NtasksPerNode => r.ntasks_per_node = v as u16,
            NumField::CpusPerTask => r.cpus_per_task = v as u16,
            NumField::MinCpus => r.min_cpus = v as u32,
            NumField::TimeLimit => r.time_limit = v as u32,
            NumField::TimeMin => r.time_min = v as u32,
            NumField::PnMinMemory => r.pn_min_memory = v,
            NumField::PnMinCpus => r.pn_min_cpus = v as u16,
            NumField::Shared => r.shared = v as u16,
            NumField::Contiguous => r.contiguous = v as u16,
            NumField::SocketsPerNode => r.sockets_per_node = v as u16,
            NumField::CoresPerSocket => r.cores_per_socket = v as u16,
            NumField::ThreadsPerCore => r.threads_per_core = v as u16,
            NumField::NtasksPerSocket => r.ntasks_per_socket = v as u16,
            NumField::NtasksPerCore => r.ntasks_per_core = v as u16,
            NumField::NtasksPerTres => r.ntasks_per_tres = v as u16,
            NumField::MailType => r.mail_type = v as u16,
            NumField::WarnFlags => r.warn_flags = v as u16,
            NumField::WarnSignal => r.warn_signal = v as u16,
            NumField::WarnTime => r.warn_time = v as u16,
            NumField::CoreSpec => r.core_spec = v as u16,
            NumField::ReqSwitch => r.req_switch = v as u32,
            NumField::HetJobOffset => r.het_job_offset = v as u32,
            NumField::Bitflags => r.bitflags = v,
            NumField::PnMinTmpDisk => r.pn_min_tmp_disk = v as u32,
            NumField::Overcommit => r.overcommit = v as u8,
            NumField::CpuFreqMin => r.cpu_freq_min = v as u32,
            NumField::CpuFreqMax => r.cpu_freq_max = v as u32,
            NumField::CpuFreqGov => r.cpu_freq_gov = v as u32,
            NumField::Requeue => r.requeue = v as u16,
            NumField::KillOnNodeFail => r.kill_on_node_fail = v as u16,
            NumField::DelayBoot => r.delay_boot = v as u32,
            NumField::Reboot => r.reboot = v as u16,
            NumField::Deadline => r.deadline = v as _,
            NumField::BeginTime => r.begin_time = v as _,
            NumField::Immediate => r.immediate = v as u16,
            NumField::Priority => r.priority = v as u32,
            NumField::Wait4Switch => r.wait4switch = v as u32,
            NumField::Profile => r.profile = v as u32,
            NumField::PowerFlags => crate::sys::job_desc_set_power_flags(r, v as u8),
            NumField::WaitAllNodes => r.wait_all_nodes = v as u16,
            NumField::TaskDist => r.task_dist = v as u32,
        }
    }

    /// `spank_job_env` entries (`NAME=value`), lossily decoded.
    pub fn spank_env(&self) -> Vec<String> {
        let r = &*self.raw;
        // SAFETY: slurmctld keeps spank_job_env_size entries in spank_job_env
        // (or NULL), alive as long as the job_desc we borrow.
        let entries = unsafe { string_array(r.spank_job_env, r.spank_job_env_size) };
        entries.into_iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect()
    }

    /// `spank_job_env` entries as raw bytes, without collecting: the
    /// submit hook looks for `--fleet*` options in every job's.
    #[inline]
    pub fn spank_env_iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let r = &*self.raw;
        // SAFETY: slurmctld keeps spank_job_env_size entries in spank_job_env
        // (or NULL), alive as long as the job_desc we borrow.
        unsafe { string_iter(r.spank_job_env, r.spank_job_env_size) }
    }

    /// The job's environment (`NAME=value` entries sbatch captured), as
    /// raw bytes; empty when sbatch sent none.
    pub fn environment(&self) -> Vec<&[u8]> {
        let r = &*self.raw;
        // SAFETY: as in spank_env, for environment and env_size.
        unsafe { string_array(r.environment, r.env_size) }
    }

    /// As [`JobDesc::environment`], without collecting: the submit hook
    /// scans the environment of every job.
    pub fn environment_iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let r = &*self.raw;
        // SAFETY: as in spank_env, for environment and env_size.
        unsafe { string_iter(r.environment, r.env_size) }
    }

    /// The number of entries in the job's environment (NULL ones included).
    pub fn environment_len(&self) -> usize {
        if self.raw.environment.is_null() {
            0
        } else {
            self.raw.env_size as usize
        }
    }

    /// Interactive allocations (salloc, srun without a batch step) carry no script.
    #[inline]
    pub fn is_batch(&mut self) -> bool {
        !self.raw.script.is_null()
    }

    /// The arguments sbatch passes to the script (`sbatch [options] script
    /// [args...]`: `argv[0]` is the script's name, the rest its arguments).
    pub fn script_args(&self) -> Vec<&[u8]> {
        let r = &*self.raw;
        // SAFETY: slurmctld's argv holds argc entries, each NULL or a
        // NUL-terminated string alive for the hook (as environment).
        unsafe { string_iter(r.argv, r.argc) }.skip(1).collect()
    }

    /// `sbatch --batch=<features>`: the node features the batch step needs.
    pub fn has_batch_features(&self) -> bool {
        let p = self.raw.batch_features;
        // SAFETY: NULL or a NUL-terminated string slurmctld owns for the hook.
        !p.is_null() && unsafe { *p } != 0
    }

    /// For tests: a zeroed descriptor with Slurm's "unset" markers.
    pub fn test_descriptor() -> Box<job_desc_msg_t> {
        // SAFETY: job_desc_msg_t is a plain C struct; all-zero is a valid
        // value (NULL pointers, zero counts), as slurm_init_job_desc_msg starts.
        let mut d: Box<job_desc_msg_t> = Box::new(unsafe { std::mem::zeroed() });
        d.min_nodes = crate::NO_VAL;
        d.max_nodes = crate::NO_VAL;
        d.num_tasks = crate::NO_VAL;
        d.time_limit = crate::NO_VAL;
        d.cpus_per_task = crate::NO_VAL16;
        d.ntasks_per_node = crate::NO_VAL16;
        d.user_id = crate::NO_VAL;
        // As slurm_init_job_desc_msg() leaves them: unset markers.
        d.het_job_offset = crate::NO_VAL;
        d.time_min = crate::NO_VAL;
        d.mail_type = crate::NO_VAL16;
        d.warn_flags = crate::NO_VAL16;
        d.warn_signal = crate::NO_VAL16;
        d.warn_time = crate::NO_VAL16;
        d.core_spec = crate::NO_VAL16;
        d.req_switch = crate::NO_VAL;
        d.shared = crate::NO_VAL16;
        d.contiguous = crate::NO_VAL16;
        d.pn_min_memory = crate::NO_VAL64;
        d.pn_min_tmp_disk = crate::NO_VAL;
        d.sockets_per_node = crate::NO_VAL16;
        d.cores_per_socket = crate::NO_VAL16;
        d.threads_per_core = crate::NO_VAL16;
        d.ntasks_per_socket = crate::NO_VAL16;
        d.ntasks_per_core = crate::NO_VAL16;
        d.ntasks_per_tres = crate::NO_VAL16;
        d.priority = crate::NO_VAL;
        d.requeue = crate::NO_VAL16;
        d.kill_on_node_fail = crate::NO_VAL16;
        d.wait_all_nodes = crate::NO_VAL16;
        d
    }

    /// Borrow a test descriptor.
    pub fn from_box(b: &'a mut job_desc_msg_t) -> JobDesc<'a> {
        JobDesc { raw: b }
    }
}

/// Free the strings of a descriptor made by [`JobDesc::test_descriptor`].
pub fn free_test_descriptor(mut d: Box<job_desc_msg_t>) {
    let mut jd = JobDesc::from_box(&mut d);
    for f in ALL_FIELDS {
        jd.set(*f, None);
    }
}

const ALL_FIELDS: &[StrField] = &[
    StrField::Account,
    StrField::AdminComment,
    StrField::ArrayInx,
    StrField::Comment,
    StrField::CpusPerTres,
    StrField::Dependency,
    StrField::ExcNodes,
    StrField::Features,
    StrField::MemPerTres,
    StrField::Name,
    StrField::Partition,
    StrField::ReqNodes,
    StrField::Script,
    StrField::StdErr,
    StrField::StdOut,
    StrField::TresBind,
    StrField::TresFreq,
    StrField::TresPerJob,
    StrField::TresPerNode,
    StrField::TresPerSocket,
    StrField::TresPerTask,
    StrField::WorkDir,
    StrField::BurstBuffer,
    StrField::Container,
    StrField::Licenses,
    StrField::MailUser,
    StrField::McsLabel,
    StrField::Network,
    StrField::Prefer,
    StrField::Qos,
    StrField::Reservation,
    StrField::SubmitLine,
    StrField::Wckey,
    StrField::CpuBind,
    StrField::MemBind,
    StrField::StdIn,
    StrField::AcctgFreq,
];

/// The non-NULL entries of a C array of `n` strings, as bytes.
///
/// # Safety
/// `arr` is NULL or points to `n` pointers, each NULL or a NUL-terminated
/// string, all alive for `'b`.
unsafe fn string_array<'b>(arr: *mut *mut c_char, n: u32) -> Vec<&'b [u8]> {
    // SAFETY: the same contract.
    unsafe { string_iter(arr, n) }.collect()
}

/// As [`string_array`], without collecting.
///
/// # Safety
/// As [`string_array`].
unsafe fn string_iter<'b>(arr: *mut *mut c_char, n: u32) -> impl Iterator<Item = &'b [u8]> {
    let n = if arr.is_null() { 0 } else { n as usize };
    (0..n).filter_map(move |i| {
        // SAFETY: i < n entries of a non-NULL array, per the contract.
        let p = unsafe { *arr.add(i) };
        // SAFETY: a non-NULL entry is a NUL-terminated string alive for 'b.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_and_non_utf8() {
        let mut d = JobDesc::test_descriptor();
        {
            let mut jd = JobDesc::from_box(&mut d);
            assert_eq!(jd.get(StrField::Partition), None);
            jd.set(StrField::Partition, Some("gpu"));
            assert_eq!(jd.get(StrField::Partition).as_deref(), Some("gpu"));
            jd.set(StrField::Partition, Some("fleet"));
            assert_eq!(jd.get(StrField::Partition).as_deref(), Some("fleet"));
            jd.set(StrField::Partition, None);
            assert_eq!(jd.get(StrField::Partition), None);
            assert!(!jd.is_batch());
            jd.set(StrField::Script, Some("#!/bin/sh\n"));
            assert!(jd.is_batch());
            jd.set_num(NumField::MinNodes, 2);
            assert_eq!(jd.num(NumField::MinNodes), 2);
        }
        free_test_descriptor(d);
    }
}
