"""Kernel data as tidy rows: NeuSight's CSVs and trainsim's own kernel tables; bad files named by line."""

import gzip

import pytest

from trainsim.errors import TrainsimError
from trainsim.sim.compute.kernels.dataset import load_neusight, read_rows
from trainsim.sim.compute.kernels.specs import Conv2d, Gemm, Streaming

HEAD = ("OPName,Latency,Device,Torch Version,CUDNN Version,Kernel Name,Warps per SM,Blocks per SM,Grid x,"
        "Grid y,Grid z,Block x,Block y,Block z,CUDA Version")
MM = HEAD + ",Kernels,B,M,N,K\n"
CONV = HEAD + ",Kernels,B,Input_Channel,Output_Channel,Kernel_Szie,Input_Size,Stride,Padding\n"
VEC = HEAD + ",B,H\n"
LAUNCH = "p2.1.0,8902,{k},1,1,1,1,1,256,1,1,cu121"


def _write(path, text, gz=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def test_neusight_matmuls_map_to_gemms(tmp_path):
    volta, ampere = "volta_sgemm_64x64_nn", "ampere_sgemm_128x64_tn"
    text = MM + (f"bmm,0.5,Tesla T4,{LAUNCH.format(k=volta)},;{volta},2,3,4,5\n"
                 f"linear,2.0,NVIDIA L4,{LAUNCH.format(k=ampere)},;{ampere},2,3,4,5\n")
    bmm, linear = read_rows(_write(tmp_path / "mm.csv.gz", text, gz=True), shown="mm.csv.gz")
    # torch.bmm of 2 x 3 x 4 by 2 x 4 x 5: 2 products of 3 x 5 outputs over K = 4
    assert bmm.spec == Gemm(m=3, n=5, k=4, batch=2) and bmm.latency_s == pytest.approx(0.5e-3)
    assert (bmm.device, bmm.kernel_class, bmm.dtype, bmm.line) == ("t4", "matmul", "fp32", 2)
    # nn.Linear(4, 5) on 2 x 3 x 4: one 6 x 5 product, one weight
    assert linear.spec == Gemm(m=6, n=5, k=4, shared_b=True) and linear.device == "l4"
    assert linear.kernels == ("ampere_sgemm_128x64_tn",) and linear.source == "mm.csv.gz"


def test_neusight_convolutions_and_vector_ops(tmp_path):
    kernels = "cudnn::winograd_nonfused::winogradforwarddata4x4;volta_sgemm_64x64_nn"
    conv, = read_rows(_write(tmp_path / "c.csv", CONV + f"conv,1.5,Tesla V100-PCIE-32GB,"
                                                        f"{LAUNCH.format(k='volta_sgemm_64x64_nn')},"
                                                        f"\"{kernels}\",8,16,32,3,14,1,1\n"))
    assert conv.spec == Conv2d(batch=8, in_channels=16, out_channels=32, height=14, width=14, kernel=(3, 3),
                               stride=1, padding=1)
    assert conv.winograd and conv.device == "v100-pcie-32gb"
    rows = read_rows(_write(tmp_path / "v.csv", VEC + f"add,0.1,Tesla P4,{LAUNCH.format(k='add')},10,20\n"
                                                      f"relu,0.1,Tesla P4,{LAUNCH.format(k='relu')},10,20\n"
                                                      f"ln,0.1,Tesla P4,{LAUNCH.format(k='ln')},10,20\n"))
    assert [r.spec for r in rows] == [Streaming("elementwise", 200, reads=2), Streaming("elementwise", 200),
                                      Streaming("layernorm", 200, row=20)]


def test_a_trainsim_kernel_table_gives_its_units(tmp_path):
    text = "op,device,dtype,m,n,k,batch,latency_us,kernels\nbmm,h100-sxm,bf16,64,64,64,8,12.5,nvjet_hsh\n"
    row, = read_rows(_write(tmp_path / "sweep.csv", text))
    assert row.spec == Gemm(m=64, n=64, k=64, batch=8, dtype="bf16")
    assert row.latency_s == pytest.approx(12.5e-6) and row.device == "h100-sxm"


@pytest.mark.parametrize("text, where, field, message", [
    ("op,device,dtype,m,n,k,batch,latency\nbmm,x,fp32,1,1,1,1,5\n", "t.csv", "latency",
     "valid choices: latency_s, latency_ms, latency_us"),
    ("op,device,dtype,m,n,k,batch\nbmm,x,fp32,1,1,1,1\n", "t.csv", "latency", "none given"),
    ("op,device,dtype,m,n,k,batch,latency_ms\nbmm,x,fp32,1,one,1,1,5\n", "t.csv:2", "n",
     "should be a number"),
    ("op,device,dtype,m,n,k,batch,latency_ms\nfft,x,fp32,1,1,1,1,5\n", "t.csv:2", "op", "unknown op 'fft'"),
    ("op,device,dtype,m,n,k,batch,latency_ms\nbmm,x,fp64,1,1,1,1,5\n", "t.csv:2", "dtype", "valid choices"),
    ("op,device,dtype,m,n,latency_ms\nbmm,x,fp32,1,1,5\n", "t.csv", "k", "missing (required for bmm rows)"),
    ("op,device,dtype,m,n,k,batch,latency_ms\nbmm,x,fp32,1,1,1,1,-5\n", "t.csv:2", "latency_ms", "> 0"),
    ("a,b\n1,2\n", "t.csv", "header", "not a kernel-data CSV"),
])
def test_bad_kernel_tables_name_file_line_and_column(tmp_path, text, where, field, message):
    with pytest.raises(TrainsimError) as info:
        read_rows(_write(tmp_path / "t.csv", text), shown="t.csv")
    assert (info.value.file, info.value.field) == (where, field)
    assert message in str(info.value)


def test_a_bad_neusight_row_names_its_line(tmp_path):
    text = MM + f"bmm,0.5,Tesla T4,{LAUNCH.format(k='k')},;k,2,3,,5\n"
    with pytest.raises(TrainsimError) as info:
        read_rows(_write(tmp_path / "mm.csv", text), shown="mm.csv")
    assert (info.value.file, info.value.field, info.value.reason) == ("mm.csv:2", "N", "missing (required)")
    with pytest.raises(TrainsimError, match="unknown op 'lstm'"):
        read_rows(_write(tmp_path / "x.csv", MM + f"lstm,0.5,Tesla T4,{LAUNCH.format(k='k')},;k,1,1,1,1\n"))


def test_load_neusight_reads_the_folder_layout(tmp_path):
    row = f"add,0.1,Tesla T4,{LAUNCH.format(k='add')},10,20\n"
    _write(tmp_path / "train/collect/add/p2.1.0/Tesla_T4.csv.gz", VEC + row, gz=True)
    _write(tmp_path / "test/elem.csv.gz", VEC.replace("B,H", "B,H,large") + row.strip() + ",True\n", gz=True)
    rows = load_neusight(tmp_path)
    assert [(r.source, r.split) for r in rows] == [("train/collect/add/p2.1.0/Tesla_T4.csv.gz", "train"),
                                                   ("test/elem.csv.gz", "test")]
    with pytest.raises(TrainsimError, match="no such folder"):
        load_neusight(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainsimError, match="holds no NeuSight CSV"):
        load_neusight(tmp_path / "empty")


def test_the_real_neusight_layer_norm_rows(shared_file):
    rows = read_rows(shared_file("kernels", "neusight", "test", "ln.csv.gz"))
    assert len(rows) == 533 and {r.kernel_class for r in rows} == {"layernorm"}
    first = rows[0]  # Tesla V100-PCIE-32GB, B = 32768, H = 1600, 0.8186 ms
    assert first.device == "v100-pcie-32gb" and first.spec == Streaming("layernorm", 32768 * 1600, row=1600)
    assert first.latency_s == pytest.approx(0.8186048150062561e-3)
