"""Recurrent layers: the fused CPU (oneDNN) and cuDNN RNN kernels and the fused LSTM/GRU cells (category matmul).

GEMMs: every weight matrix multiplies every token once: ``2 * tokens * numel(W)`` for each 2-D weight (w_ih, w_hh,
and w_hr with projections), summed over layers and directions; ``tokens = numel(input) / input_size``.
Gate math per hidden unit per token (G = gates = rows(w_ih) / hidden_size), with pointwise.py's costs and the
bias adds taken as GEMM epilogues (not counted, as for addmm):
    LSTM (G=4)  19: ih + hh sum 4, 3 sigmoid 9, tanh(g) 1, c = f*c + i*g 3, tanh(c) 1, h = o*tanh(c) 1
    GRU  (G=3)  16: r, z sums 2, 2 sigmoid 6, n = tanh(ih_n + r * hh_n) 3, h = (1-z)*n + z*h 4
    RNN  (G=1)   2: ih + hh sum, tanh/relu
(The CPU fallback without oneDNN decomposes an LSTM into mm/addmm/add/sigmoid_/tanh/mul: the same GEMM FLOPs, and
4 more per unit because its input-projection bias add is a separate op there.)
Backward: the data grads and the weight grads each repeat the forward GEMMs; the gate math is counted twice. cuDNN's
data-gradient pass always runs (aten/src/ATen/native/cudnn/RNN.cpp computes it unconditionally), the weight pass
only when the weights need grads.
"""

from __future__ import annotations

from tscope_callbacks.formulas.common import numel, reg

__all__ = ["GATE_FLOPS"]

GATE_FLOPS = {4: 19, 3: 16, 1: 2}


def _tokens(x) -> int:
    return numel(x) // x[-1] if len(x) and x[-1] else 0


def _layer(x, w_ih, w_hh, hidden_size) -> tuple[int, int]:
    """(GEMM FLOPs, gate FLOPs) of one layer-direction."""
    t = _tokens(x)
    gates = w_ih[0] // hidden_size if hidden_size else 1
    return 2 * t * (numel(w_ih) + numel(w_hh)), t * hidden_size * GATE_FLOPS.get(gates, 5 * gates)


def _mkldnn_rnn_layer(x, w0, w1, w2, w3, hx, cx, reverse, batch_sizes, mode, hidden_size, *args, out=None,
                      **kwargs) -> int:
    g, p = _layer(x, w0, w1, hidden_size)
    return g + p


def _mkldnn_rnn_layer_backward(x, w1, w2, w3, w4, hx, cx, output, hy, cy, go, ghy, gcy, reverse, mode, hidden_size,
                               *args, out=None, **kwargs) -> int:
    g, p = _layer(x, w1, w2, hidden_size)
    return 2 * g + 2 * p


def _cudnn_totals(x, weights, hidden_size, num_layers, bidirectional) -> tuple[int, int]:
    t = _tokens(x)
    mats = [w for w in weights if w is not None and len(w) == 2]
    gemm = 2 * t * sum(numel(w) for w in mats)
    gates = mats[0][0] // hidden_size if mats and hidden_size else 1
    units = t * hidden_size * num_layers * (2 if bidirectional else 1)
    return gemm, units * GATE_FLOPS.get(gates, 5 * gates)


def _cudnn_rnn(x, weight, stride0, weight_buf, hx, cx, mode, hidden_size, proj_size, num_layers, batch_first, dropout,
               train, bidirectional, *args, out=None, **kwargs) -> int:
    g, p = _cudnn_totals(x, weight, hidden_size, num_layers, bidirectional)
    return g + p


def _cudnn_rnn_backward(x, weight, stride0, weight_buf, hx, cx, output, go, ghy, gcy, mode, hidden_size, proj_size,
                        num_layers, batch_first, dropout, train, bidirectional, batch_sizes, dropout_state, reserve,
                        output_mask=None, *args, out=None, **kwargs) -> int:
    g, p = _cudnn_totals(x, weight, hidden_size, num_layers, bidirectional)
    mask = list(output_mask) if output_mask is not None else [True] * 4
    # PyTorch runs cuDNN's data-gradient pass unconditionally (it mutates the reserve the weight pass reads), even
    # when no input needs a gradient; the weight pass only when the weights need one (output_mask[3])
    return g + (g if mask[3] else 0) + 2 * p


def _lstm_cell(input_gates, hidden_gates, cx, *args, out=None, **kwargs) -> int:
    return numel(cx) * GATE_FLOPS[4]


def _gru_cell(input_gates, hidden_gates, hx, *args, out=None, **kwargs) -> int:
    return numel(hx) * GATE_FLOPS[3]


def _lstm_cell_backward(grad_hy, grad_cy, cx, *args, out=None, **kwargs) -> int:
    return numel(cx) * GATE_FLOPS[4]


def _gru_cell_backward(grad_hy, workspace, *args, out=None, **kwargs) -> int:
    return numel(grad_hy) * GATE_FLOPS[3]


reg(["mkldnn_rnn_layer"], "matmul", _mkldnn_rnn_layer)
reg(["mkldnn_rnn_layer_backward"], "matmul", _mkldnn_rnn_layer_backward)
reg(["_cudnn_rnn"], "matmul", _cudnn_rnn)
reg(["_cudnn_rnn_backward"], "matmul", _cudnn_rnn_backward)
reg(["_thnn_fused_lstm_cell"], "pointwise", _lstm_cell)
reg(["_thnn_fused_gru_cell"], "pointwise", _gru_cell)
reg(["_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_lstm_cell_backward"], "pointwise", _lstm_cell_backward)
reg(["_thnn_fused_gru_cell_backward"], "pointwise", _gru_cell_backward)
