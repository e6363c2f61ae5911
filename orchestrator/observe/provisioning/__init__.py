"""The provisioning study, apart from sweeps: how many CPU cores per GPU real clusters hand out, read from
public GPU-cluster traces (cluster_traces), analysed (analysis), behind its own command (cli)."""
