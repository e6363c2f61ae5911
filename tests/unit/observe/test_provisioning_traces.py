"""Cluster-trace loaders: each format by its real header, left-out rows, and errors that name file, line and column."""

import math

import pytest

from orchestrator.observe.provisioning.cluster_traces import ClusterTraceError, combine, detect_format, load_trace

POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time")
DLRM_HEADER = ("instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,rdma_request,rdma_limit,"
               "memory_request,memory_limit,disk_request,disk_limit,max_instance_per_node,creation_time,"
               "scheduled_time,deletion_time")
SEREN_HEADER = ("job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,duration,queue,"
                "gpu_time")
KALOS_HEADER = ("job_id,user,node_num,gpu_num,cpu_num,mem_per_pod_GB,shared_mem_per_pod,type,state,submit_time,"
                "start_time,end_time,fail_time,stop_time,duration,queue,gpu_time")
SUMMARY_HEADER = ("id,job_num,cpu_job_num,gpu_job_num,avg_run_time_gpu,avg_que_time_gpu,avg_gpu_num,"
                  "med_run_time_gpu,med_que_time_gpu,med_gpu_num,max_run_time_gpu,max_gpu,complete_rate_gpu,"
                  "cancel_rate_gpu,fail_rate_gpu,complete_gpu_time,cancel_gpu_time,fail_gpu_time,"
                  "complete_rate_gpu_time,cancel_rate_gpu_time,fail_rate_gpu_time,avg_run_time_cpu,"
                  "avg_que_time_cpu,med_run_time_cpu,med_que_time_cpu,complete_rate_cpu,cancel_rate_cpu,fail_rate_cpu")


def write(tmp_path, name, *lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def pods(tmp_path):
    return write(tmp_path, "pods.csv", POD_HEADER,
                 "p0,12000,16384,1,1000,,LS,Running,0,100,0",            # 12 cores on 1 GPU: 12
                 "p1,2000,12288,1,500,V100M16,LS,Running,5,60,10",        # 2 cores on half a GPU: 4
                 "p2,8000,1024,8,1000,V100M16,BE,Pending,7,9,",           # 8 on 8: 1, never scheduled
                 "p3,4000,1024,0,0,,BE,Running,0,50,0",                   # no GPU: left out
                 "p4,3000,1024,1,1000,,LS,Succeeded,1,12,2")              # 3


def test_v2023_pods_share_gpus_and_leave_out_pods_without_one(tmp_path):
    t = load_trace(pods(tmp_path))
    assert (t.format.name, t.kind, t.rows, t.excluded_no_gpu) == ("alibaba-v2023-pods", "requests", 5, 1)
    f = t.frame.set_index("job_id")
    assert list(f.index) == ["p0", "p1", "p2", "p4"]
    assert f.loc["p1", "gpus"] == 0.5 and f.loc["p1", "cores"] == 2.0 and f.loc["p2", "gpus"] == 8.0
    assert f.loc["p1", "gpu_type"] == "V100M16" and f.loc["p0", "gpu_type"] is None
    assert f.loc["p0", "duration_s"] == 100 and f.loc["p1", "duration_s"] == 50 and math.isnan(f.loc["p2", "duration_s"])
    assert "1 job(s) without a GPU left out" in t.notes()


def test_node_lists_are_nodes_not_requests(tmp_path):
    v2023 = load_trace(write(tmp_path, "openb_node_list_all_node.csv", "sn,cpu_milli,memory_mib,gpu,model",
                             "n0,96000,393216,8,G2", "n1,32000,262144,0,", "n2,16000,262144,2,P100"))
    assert (v2023.format.name, v2023.kind, v2023.excluded_no_gpu) == ("alibaba-v2023-nodes", "nodes", 1)
    assert list(v2023.frame["cores"] / v2023.frame["gpus"]) == [12.0, 8.0]
    assert list(v2023.frame["gpu_type"]) == ["G2", "P100"]
    spot = load_trace(write(tmp_path, "node_info_df.csv", "gpu_model,gpu_capacity_num,cpu_num,node_name",
                            "A10,1,128,0", "A100-SXM4-80GB,8,128,3"))
    assert (spot.format.name, spot.kind) == ("alibaba-v2026-nodes", "nodes")
    assert list(spot.frame["cores"] / spot.frame["gpus"]) == [128.0, 16.0]
    assert any("not what jobs requested" in n for n in spot.notes())


def test_v2025_dlrm_instances(tmp_path):
    t = load_trace(write(tmp_path, "disaggregated_DLRM_trace.csv", DLRM_HEADER,
                         "instance_0,HN,app_0,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,,,",
                         "instance_1,CN,app_1,96,96,0,0,1,1,480.0,480.0,425.0,500.0,-1,2676636.0,2676679.0,",
                         "instance_2,HN,app_2,8,8,1,1,25,25,120.0,120.0,640.0,800.0,8,100.0,110.0,170.0"))
    assert (t.format.name, t.excluded_no_gpu) == ("alibaba-v2025-dlrm", 1)
    assert list(t.frame["cores"]) == [12.0, 8.0] and list(t.frame["gpus"]) == [1.0, 1.0]
    assert math.isnan(t.frame["duration_s"][0]) and t.frame["duration_s"][1] == 60.0
    assert "names no GPU type: figures for the whole trace only" in t.notes()


def test_v2026_jobs_count_every_worker(tmp_path):
    t = load_trace(write(tmp_path, "job_info_df.csv",
                         "job_name,organization,gpu_model,cpu_request,gpu_request,worker_num,submit_time,duration,job_type",
                         "437261,57,A100-SXM4-80GB,15,1,94,9589663,71718,Spot", "239255,13,A10,20,0,1,0,2764799,HP"))
    assert (t.format.name, t.excluded_no_gpu) == ("alibaba-v2026-jobs", 1)
    row = t.frame.iloc[0]
    assert (row["gpus"], row["cores"], row["gpu_type"], row["duration_s"]) == (94.0, 1410.0, "A100-SXM4-80GB", 71718.0)


@pytest.mark.parametrize("header,row,per_gpu,duration", [
    (SEREN_HEADER, "5778432,u5907,1,8,128,Other,FAILED,2023-03-01 00:18:22+08:00,2023-03-01 00:18:54+08:00,"
                   "2023-03-01 00:20:51+08:00,117,32,936.0", 16.0, 117.0),
    (KALOS_HEADER, "dlc1,uf794,8,64,960,1000,100.0,Other,FAILED,2023-05-17 11:00:58+00:00,2023-05-17 11:01:08+00:00,"
                   "2023-05-17 11:01:16+00:00,2023-05-17 11:01:16+00:00,,18,10.0,1152.0", 15.0, 18.0),
])
def test_acmetrace_job_traces(tmp_path, header, row, per_gpu, duration):
    cpu_job = row.split(",")
    cpu_job[3] = "0"  # gpu_num: a CPU job, left out
    t = load_trace(write(tmp_path, "trace.csv", header, row, ",".join(cpu_job)))
    assert (t.format.name, t.kind, t.excluded_no_gpu) == ("acmetrace-jobs", "requests", 1)
    assert t.frame["cores"][0] / t.frame["gpus"][0] == per_gpu and t.frame["duration_s"][0] == duration


def test_acmetrace_summary_loads_what_it_has_and_says_what_it_cannot_answer(tmp_path):
    seren = ("Seren,1031550,367737,663813,1414.335,445.984,5.68,122.0,1.0,1.0,1209604.0,1024.0,0.497,0.075,0.429,"
             "4560592618.0,14274584510.0,2675447459.0,0.212,0.664,0.124,733.894,4.813,14.0,1.0,0.858,0.039,0.102")
    philly = ("Philly,112956,0,112956,18006.055,3760.604,1.928,874.0,189.0,1.0,4240676.0,128.0,0.604,0.09,0.305,"
              "2210176414.0,2025326056.0,2659215061.0,0.321,0.294,0.386,,,,,,,")
    t = load_trace(write(tmp_path, "cluster_summary.csv", SUMMARY_HEADER, seren, philly))
    assert (t.format.name, t.kind) == ("acmetrace-summary", "summary")
    assert t.excluded_no_gpu == 1031550 - 663813
    assert list(t.frame["job_id"]) == ["Seren", "Philly"] and list(t.frame["jobs"]) == [663813, 112956]
    assert t.frame["cores"].isna().all()
    assert any("no CPU request per job" in n for n in t.notes())


def test_unknown_header_names_the_file_and_lists_every_format(tmp_path):
    with pytest.raises(ClusterTraceError) as err:
        load_trace(write(tmp_path, "mystery.csv", "a,b,c", "1,2,3"))
    msg = str(err.value)
    assert msg.startswith("mystery.csv:1: unknown header (a, b, c)")
    assert "alibaba-v2023-pods: name, cpu_milli, num_gpu, gpu_milli" in msg and "acmetrace-summary" in msg


def test_missing_column_names_it_and_the_closest_format(tmp_path):
    header = POD_HEADER.replace(",gpu_milli", "")
    with pytest.raises(ClusterTraceError, match=r"pods\.csv:1: missing column\(s\) gpu_milli for alibaba-v2023-pods"):
        load_trace(write(tmp_path, "pods.csv", header, "p0,12000,16384,1,,LS,Running,0,100,0"))
    with pytest.raises(ClusterTraceError, match="missing column"):
        detect_format("x.csv", ["gpu_model", "gpu_capacity_num", "node_name"])


@pytest.mark.parametrize("cell,problem", [
    ("abc", "column 'cpu_milli' is 'abc', expected a number >= 0"),
    ("-5", "column 'cpu_milli' is '-5'"),
    ("", "column 'cpu_milli' is empty"),
])
def test_bad_row_names_file_line_and_column(tmp_path, cell, problem):
    path = write(tmp_path, "pods.csv", POD_HEADER, "p0,12000,16384,1,1000,,LS,Running,0,100,0",
                 "",  # a blank line still counts as a line of the file
                 f"p1,{cell},16384,1,1000,,LS,Running,0,100,0")
    with pytest.raises(ClusterTraceError) as err:
        load_trace(path)
    assert str(err.value).startswith(f"pods.csv:4: {problem}")
    assert err.value.line == 4


def test_bad_rows_are_counted_and_shares_above_a_whole_gpu_refused(tmp_path):
    path = write(tmp_path, "pods.csv", POD_HEADER, "p0,12000,16384,1,1200,,LS,Running,0,100,0",
                 "p1,x,16384,1,1000,,LS,Running,0,100,0")
    with pytest.raises(ClusterTraceError, match=r"pods\.csv:2: column 'gpu_milli' is '1200', expected a number >= 0 "
                                                r"and <= 1000"):
        load_trace(path)
    path = write(tmp_path, "pods2.csv", POD_HEADER, "p0,y,16384,1,1000,,LS,Running,0,100,0",
                 "p1,x,16384,1,1000,,LS,Running,0,100,0")
    with pytest.raises(ClusterTraceError, match=r"pods2\.csv:2: .*\(1 more bad row\(s\)\)"):
        load_trace(path)


def test_unreadable_files(tmp_path):
    with pytest.raises(ClusterTraceError, match="empty.csv: empty file"):
        load_trace(write(tmp_path, "empty.csv", ""))
    with pytest.raises(ClusterTraceError, match="gone.csv: no such file"):
        load_trace(tmp_path / "gone.csv")
    with pytest.raises(ClusterTraceError, match=r"ragged.csv: not a readable CSV: .*line 3"):
        load_trace(write(tmp_path, "ragged.csv", "gpu_model,gpu_capacity_num,cpu_num,node_name", "A10,1,128,0",
                         "A10,1,128,0,9,9"))


def test_combine_labels_traces_and_keeps_kinds_apart(tmp_path):
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir()
    b.mkdir()
    one = load_trace(write(a, "node_info_df.csv", "gpu_model,gpu_capacity_num,cpu_num,node_name", "A10,1,128,0"))
    two = load_trace(write(b, "node_info_df.csv", "gpu_model,gpu_capacity_num,cpu_num,node_name", "H800,8,192,1"))
    three = load_trace(pods(tmp_path))
    frame = combine([one, two, three])
    assert list(frame["trace"].unique()) == ["a/node_info_df.csv", "b/node_info_df.csv", "pods.csv"]
    assert list(frame.groupby("trace", sort=False)["kind"].first()) == ["nodes", "nodes", "requests"]
    assert combine([]).empty
