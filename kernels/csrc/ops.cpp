// The schemas of the fused operators whose CPU kernels live in cpu/*.cpp (their fake kernels and
// autograd are registered from Python, in kernels/phi.py, aggregate.py and refine.py; the
// operators with Triton kernels only are defined there, with torch.library.custom_op).
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(matris, m) {
    m.def("gated_phi(Tensor? rows, Tensor? row_weight, Tensor bias1, Tensor core_weight, Tensor core_bias, "
          "Tensor gate_weight, Tensor gate_bias, Tensor core_norm, Tensor gate_norm, Tensor? core_norm_bias, "
          "Tensor? gate_norm_bias, Tensor[] projections, Tensor[] indices, float eps, bool layer, SymInt chunk) -> "
          "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
    m.def("gated_phi_backward(Tensor grad, Tensor? row_weight, Tensor core_weight, Tensor gate_weight, "
          "Tensor core_norm, Tensor gate_norm, Tensor? core_norm_bias, Tensor slope, Tensor core, Tensor gate, "
          "Tensor r_c, Tensor r_g, Tensor sig, Tensor[] indices, SymInt[] projection_rows, bool want_rows, "
          "bool[] want_projections, bool layer, SymInt chunk) -> Tensor[]");
    m.def("attention_pair(Tensor rows, Tensor? weight, Tensor? row_index, Tensor messages, Tensor target, "
          "Tensor source, SymInt num_segments, Tensor? res_weight) -> "
          "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
    m.def("attention_pair_backward(Tensor g_t, Tensor g_s, Tensor? g_y, Tensor rows, Tensor? weight, "
          "Tensor? row_index, Tensor messages, Tensor target, Tensor source, Tensor alpha, Tensor out_s, "
          "Tensor out_t, Tensor lse_s, Tensor lse_t, Tensor? res_weight, bool want_rows, bool want_messages) -> "
          "(Tensor, Tensor)");
    m.def("refine_edges(Tensor u, Tensor q, Tensor src, Tensor tgt, SymInt num_segments, Tensor? y, "
          "Tensor? res_weight, Tensor? w1, Tensor? b1, Tensor? w2, Tensor? b2, bool smooth, SymInt chunk) -> "
          "(Tensor, Tensor, Tensor)");
    m.def("refine_edges_backward(Tensor g_agg, Tensor? g_ynew, Tensor u, Tensor q, Tensor src, Tensor tgt, "
          "Tensor? w1, Tensor? w2, Tensor h, Tensor? res_weight, bool smooth, SymInt chunk, bool want_u, "
          "bool want_q, bool want_y) -> (Tensor, Tensor, Tensor)");
}
