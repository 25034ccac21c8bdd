"""The ATen policy table (amp_compiler/policy/aten_ops.toml) and its reference, torch.autocast.

torch.autocast's CUDA policy is checked directly: the op runs on fake CUDA tensors (no GPU needed)
with autocast forced on for the CUDA device; an op on the low-precision list returns FP16 from FP32
inputs, an op on an FP32 list returns FP32 from FP16 inputs.
"""

import subprocess
import sys
import warnings

import pytest
import tomllib
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from amp_compiler.fx.graph.policy import default_policy, op_name, policy_name
from amp_compiler.policy import Category
from tests.support import REPO_ROOT

ROOT = REPO_ROOT
TABLE = ROOT / "amp_compiler" / "policy" / "aten_ops.toml"
ALLOWED_KEYS = {
    "op", "domain", "category", "reason", "sensitivity", "refs", "dtype_attr", "fp32_args",
    "follow_outputs", "observer", "tensor_core", "recurrent", "fp8_operands", "fp8_bias", "fp8_transposed", "fp8_kept",
    "gemm", "signal", "dynamic_range", "periodic", "positions", "logit_differences", "logit_inputs", "index_inputs", "selects", "scores", "thresholds",
    "thresholds_operand",
}
aten = torch.ops.aten
F16, F32 = torch.float16, torch.float32


@pytest.fixture(scope="module")
def entries():
    with TABLE.open("rb") as f:
        data = tomllib.load(f)
    assert set(data) == {"op"}
    return data["op"]


def test_entries_are_well_formed(entries):
    assert len(entries) > 400
    names = [e["op"] for e in entries]
    assert len(names) == len(set(names)), "duplicate entries"
    for e in entries:
        assert set(e) <= ALLOWED_KEYS, (e["op"], set(e) - ALLOWED_KEYS)
        assert e["domain"] == "aten"
        assert e["category"] in {c.value for c in Category}
        assert len(e["reason"]) > 30, e["op"]
        assert (e["category"] == "HIGH") == ("sensitivity" in e), e["op"]
        assert e["refs"].startswith("torch:") and e["refs"][6:] in {"L", "F", "P", "B", "-"}, e["op"]
        if e["refs"] == "torch:L":
            assert e["category"] == "LOW", e["op"]
        if e["refs"] in ("torch:F", "torch:B"):
            assert e["category"] == "HIGH", e["op"]


def test_every_entry_names_an_aten_operator(entries):
    missing = [e["op"] for e in entries if not hasattr(aten, e["op"])]
    assert not missing


def test_fx_fields_name_schema_arguments(entries):
    for e in entries:
        packet = getattr(aten, e["op"])
        schemas = [getattr(packet, o)._schema for o in packet.overloads()]
        for arg in e.get("fp32_args", ()):
            assert any(arg in [a.name for a in s.arguments] for s in schemas), (e["op"], arg)
        if "dtype_attr" in e:
            assert any(e["dtype_attr"] in [a.name for a in s.arguments] for s in schemas), e["op"]


# Matrix-vector products and dots: a product layout (policy.high.raw-small-product reads their K), no Tensor Core work.
MEMORY_BOUND_PRODUCTS = {"mv", "addmv", "linalg_vecdot", "dot", "vdot"}


def test_gemm_layouts_name_schema_arguments(entries):
    """Each product layout (``[op.gemm]``: Tensor Core ops, and the matrix-vector products and dots that are
    none) names arguments of the op's schema and says where it is defined; where the FP8 path names the same
    op's operands, they are the same ones."""
    kinds = {}
    for e in entries:
        if "gemm" not in e:
            continue
        gemm, name = e["gemm"], e["op"]
        assert gemm["source"].startswith(f"aten::{name}("), name
        assert e.get("tensor_core") or name in MEMORY_BOUND_PRODUCTS, name
        packet = getattr(aten, name)
        arguments = {a.name for o in packet.overloads() for a in getattr(packet, o)._schema.arguments}
        assert {*gemm["operands"], gemm.get("bias", gemm["operands"][0]), gemm.get("k_axis", gemm["operands"][0])} \
            <= arguments, name
        if gemm["kind"] == "einsum":
            assert "equation" in arguments, name
        if "fp8_operands" in e:
            assert gemm["operands"] == e["fp8_operands"] and gemm.get("bias") == e.get("fp8_bias"), name
        kinds.setdefault(gemm["kind"], set()).add(name)
    assert kinds == {
        "matmul": {"mm", "bmm", "matmul", "linear", "addmm", "baddbmm", "addbmm", "_addmm_activation",
                   *MEMORY_BOUND_PRODUCTS},
        "conv": {"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_tbc"},
        "conv_transpose": {"conv_transpose1d", "conv_transpose2d", "conv_transpose3d"},
        "einsum": {"einsum"},
    }


def test_loaded_with_the_shared_policy_machinery():
    policy = default_policy()
    assert policy.get("linear").category is Category.LOW
    assert policy.get("softmax").category is Category.HIGH
    assert policy.get("cat").category is Category.PASS
    assert policy.get("eq").category is Category.NONFLOAT
    assert policy.info_of("batch_norm").fp32_args == {"weight", "bias", "running_mean", "running_var"}
    assert policy.get("no_such_op") is None
    assert op_name(aten.add_.Tensor) == "add_" and policy_name("add_") == "add"
    assert policy_name("__and__") == "__and__"
    assert op_name(len) is None


def _samples():
    def T(*shape, dt=F32):
        return torch.empty(shape, device="cuda", dtype=dt)

    def I(*shape):  # noqa: E743
        return torch.zeros(shape, device="cuda", dtype=torch.long)

    u = lambda op: (lambda dt: getattr(aten, op)(T(4, 4, dt=dt)))  # noqa: E731
    s = {op: u(op) for op in (
        "exp exp2 expm1 log log2 log10 log1p reciprocal rsqrt sinh cosh tan asin acos erfinv sqrt sigmoid tanh "
        "erf neg abs sin cos relu gelu silu hardswish hardsigmoid round floor sign logit softplus square elu "
        "leaky_relu hardtanh relu6 clone contiguous"
    ).split()}
    s.update({
        "pow": lambda dt: aten.pow.Tensor_Scalar(T(4, 4, dt=dt), 2),
        "sum": lambda dt: aten.sum.dim_IntList(T(4, 4, dt=dt), [1]),
        "prod": lambda dt: aten.prod.dim_int(T(4, 4, dt=dt), 1),
        "mean": lambda dt: aten.mean.dim(T(4, 4, dt=dt), [1]),
        "cumsum": lambda dt: aten.cumsum(T(4, 4, dt=dt), 1),
        "cumprod": lambda dt: aten.cumprod(T(4, 4, dt=dt), 1),
        "logsumexp": lambda dt: aten.logsumexp(T(4, 4, dt=dt), [1]),
        "var": lambda dt: aten.var.correction(T(4, 4, dt=dt), [1]),
        "norm": lambda dt: aten.norm.ScalarOpt_dim(T(4, 4, dt=dt), 2, [1]),
        "linalg_vector_norm": lambda dt: aten.linalg_vector_norm(T(4, 4, dt=dt), 2, [1]),
        "dist": lambda dt: aten.dist(T(4, 4, dt=dt), T(4, 4, dt=dt)),
        "cdist": lambda dt: aten.cdist(T(4, 4, dt=dt), T(4, 4, dt=dt)),
        "cosine_similarity": lambda dt: aten.cosine_similarity(T(4, 4, dt=dt), T(4, 4, dt=dt)),
        "softmax": lambda dt: aten.softmax.int(T(4, 4, dt=dt), 1),
        "log_softmax": lambda dt: aten.log_softmax.int(T(4, 4, dt=dt), 1),
        "_softmax": lambda dt: aten._softmax(T(4, 4, dt=dt), 1, False),
        "layer_norm": lambda dt: aten.layer_norm(T(4, 4, dt=dt), [4]),
        "group_norm": lambda dt: aten.group_norm(T(2, 4, 4, dt=dt), 2),
        "rms_norm": lambda dt: aten.rms_norm(T(4, 4, dt=dt), [4]),
        "batch_norm": lambda dt: aten.batch_norm(
            T(2, 4, 4, dt=dt), T(4, dt=dt), T(4, dt=dt), T(4, dt=dt), T(4, dt=dt), False, 0.1, 1e-5, True),
        "mm": lambda dt: aten.mm(T(4, 4, dt=dt), T(4, 4, dt=dt)),
        "bmm": lambda dt: aten.bmm(T(2, 4, 4, dt=dt), T(2, 4, 4, dt=dt)),
        "matmul": lambda dt: aten.matmul(T(4, 4, dt=dt), T(4, 4, dt=dt)),
        "linear": lambda dt: aten.linear(T(4, 4, dt=dt), T(4, 4, dt=dt), T(4, dt=dt)),
        "addmm": lambda dt: aten.addmm(T(4, dt=dt), T(4, 4, dt=dt), T(4, 4, dt=dt)),
        "baddbmm": lambda dt: aten.baddbmm(T(2, 4, 4, dt=dt), T(2, 4, 4, dt=dt), T(2, 4, 4, dt=dt)),
        "einsum": lambda dt: aten.einsum("ij,jk->ik", [T(4, 4, dt=dt), T(4, 4, dt=dt)]),
        "conv1d": lambda dt: aten.conv1d(T(1, 4, 8, dt=dt), T(4, 4, 3, dt=dt)),
        "conv2d": lambda dt: aten.conv2d(T(1, 4, 8, 8, dt=dt), T(4, 4, 3, 3, dt=dt)),
        "conv_transpose2d": lambda dt: aten.conv_transpose2d.input(T(1, 4, 8, 8, dt=dt), T(4, 4, 3, 3, dt=dt)),
        "prelu": lambda dt: aten.prelu(T(1, 4, 8, dt=dt), T(4, dt=dt)),
        "scaled_dot_product_attention": lambda dt: aten.scaled_dot_product_attention(
            T(1, 2, 4, 8, dt=dt), T(1, 2, 4, 8, dt=dt), T(1, 2, 4, 8, dt=dt)),
        "mse_loss": lambda dt: aten.mse_loss(T(4, 4, dt=dt), T(4, 4, dt=dt)),
        "l1_loss": lambda dt: aten.l1_loss(T(4, 4, dt=dt), T(4, 4, dt=dt)),
        "nll_loss": lambda dt: aten.nll_loss(T(4, 4, dt=dt), I(4)),
        "cross_entropy_loss": lambda dt: aten.cross_entropy_loss(T(4, 4, dt=dt), I(4)),
        "binary_cross_entropy_with_logits": lambda dt: aten.binary_cross_entropy_with_logits(
            T(4, 4, dt=dt), T(4, 4, dt=dt)),
        "kl_div": lambda dt: aten.kl_div(T(4, 4, dt=dt), T(4, 4, dt=dt)),
        "upsample_nearest2d": lambda dt: aten.upsample_nearest2d.vec(T(1, 2, 4, 4, dt=dt), [8, 8], None),
        "upsample_bilinear2d": lambda dt: aten.upsample_bilinear2d.vec(T(1, 2, 4, 4, dt=dt), [8, 8], False, None),
        "avg_pool2d": lambda dt: aten.avg_pool2d(T(1, 2, 4, 4, dt=dt), [2, 2]),
        "adaptive_avg_pool2d": lambda dt: aten.adaptive_avg_pool2d(T(1, 2, 4, 4, dt=dt), [1, 1]),
        "max_pool2d": lambda dt: aten.max_pool2d(T(1, 2, 4, 4, dt=dt), [2, 2]),
        "cat": lambda dt: aten.cat([T(4, dt=dt), T(4, dt=dt)]),
        "broadcast_tensors": lambda dt: aten.broadcast_tensors([T(4, 1, dt=dt), T(1, 4, dt=dt)])[0],
        "broadcast_to": lambda dt: aten.broadcast_to(T(1, 4, dt=dt), [4, 4]),
        "diff": lambda dt: aten.diff(T(4, 4, dt=dt)),
        "outer": lambda dt: aten.outer(T(4, dt=dt), T(4, dt=dt)),
        "addr": lambda dt: aten.addr(T(4, 4, dt=dt), T(4, dt=dt), T(4, dt=dt)),
        "embedding_bag": lambda dt: aten.embedding_bag(T(10, 4, dt=dt), I(6), I(2), False, 1)[0],
        "_weight_norm": lambda dt: aten._weight_norm(T(4, 4, dt=dt), T(4, 1, dt=dt)),
        "embedding": lambda dt: aten.embedding(T(10, 4, dt=dt), I(3)),
        "gather": lambda dt: aten.gather(T(10, 4, dt=dt), 0, I(3, 4)),
        "add": lambda dt: aten.add.Tensor(T(4, dt=dt), T(4, dt=dt)),
        "mul": lambda dt: aten.mul.Tensor(T(4, dt=dt), T(4, dt=dt)),
        "addcmul": lambda dt: aten.addcmul(T(4, dt=dt), T(4, dt=dt), T(4, dt=dt)),
        "where": lambda dt: aten.where.self(torch.zeros(4, device="cuda", dtype=torch.bool), T(4, dt=dt), T(4, dt=dt)),
        "dropout": lambda dt: aten.dropout(T(4, dt=dt), 0.1, False),
        "lstm": lambda dt: aten.lstm.input(
            T(3, 2, 4, dt=dt), [T(1, 2, 4, dt=dt), T(1, 2, 4, dt=dt)],
            [T(16, 4, dt=dt), T(16, 4, dt=dt), T(16, dt=dt), T(16, dt=dt)], True, 1, 0.0, False, False, False)[0],
    })
    return s


def test_table_agrees_with_torch_autocast_cuda_lists():
    """The refs code of every probed op is what torch.autocast does on CUDA (L / F / unlisted)."""
    policy = default_policy()
    observed, failures = {}, []
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", F16)
    try:
        with FakeTensorMode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, call in _samples().items():
                low = call(F32).dtype == F16
                high = call(F16).dtype == F32
                observed[name] = "L" if low else ("F" if high else "-")
    finally:
        torch.set_autocast_enabled("cuda", False)
    assert len(observed) > 80
    for name, code in observed.items():
        entry = policy.get(name)
        assert entry is not None, name
        ref = entry.refs.removeprefix("torch:")
        if ref in ("P", "B"):
            ref = "-" if ref == "P" else "F"
        if ref != code:
            failures.append(f"{name}: table says torch:{entry.refs[6:]}, autocast does {code}")
        if code == "L" and entry.category is not Category.LOW:
            failures.append(f"{name}: autocast runs it in low precision, table says {entry.category.value}")
        if code == "F" and entry.category is not Category.HIGH:
            failures.append(f"{name}: autocast runs it in FP32, table says {entry.category.value}")
    assert not failures, "\n".join(failures)


def test_onnx_users_never_import_torch():
    code = (
        "import sys, amp_compiler, amp_compiler.policy, amp_compiler.passes; "
        "from amp_compiler import convert; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class _CommonOps(torch.nn.Module):
    """ATen ops torch.export keeps that common models emit (F.mse_loss's broadcast_tensors, EmbeddingBag,
    the weight_norm parametrization, diff, outer, broadcast_to)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.bag = torch.nn.EmbeddingBag(50, 8, mode="mean")
        self.wn = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(8, 8))

    def forward(self, x, b, ids, offsets):
        h = self.fc(x)
        a, c = torch.broadcast_tensors(h, b)
        return (a * c, torch.broadcast_to(b, h.shape) * h, torch.diff(h, dim=-1), torch.outer(h[0], h[1]),
                self.bag(ids, offsets), self.wn(h))


@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_common_ops_are_in_the_table_and_convert_without_warnings(target):
    import amp_compiler.fx as ampfx

    torch.manual_seed(0)
    m = _CommonOps().eval()
    args = (torch.randn(4, 8), torch.randn(1, 8), torch.randint(0, 50, (12,)), torch.tensor([0, 3, 6, 9]))
    gm = ampfx.convert(m, args, target=target)
    rep = ampfx.report(gm)
    assert rep.warnings == []
    ops = {d.op_type.split(".")[1]: d for d in rep.decisions if d.op_type.startswith("aten.")}
    assert ops["_weight_norm"].precision == "fp32"  # its norm sums squares
    for out, ref in zip(gm(*args), m(*args), strict=True):
        assert torch.allclose(out, ref, rtol=0.02, atol=0.02)
    step = ampfx.prepare_training(torch.nn.Linear(8, 8), torch.nn.MSELoss(), (args[0], torch.randn(4, 8)),
                                  target=target)
    assert step.report.warnings == []  # F.mse_loss's broadcast_tensors
