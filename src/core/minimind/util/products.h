// Products: which products a module runs, precision and fp32 library, as a value the model
// is built with (no torch here: the compute plan includes it).
#pragma once

#include <type_traits>

#include "minimind/choices.h"

namespace minimind {

// The products a module runs, as the compute plan chose them (ComputePlan::products): their
// precision and the library of fp32 products. Handed to the model when it is built; every
// product function of util/matmul.h takes one, so nothing is read from the process.
struct Products {
  Precision precision = Precision::fp32;
  MatmulBackend fp32 = MatmulBackend::openblas;  // resolved: openblas or onednn

  // Whether products of float32 tensors leave ATen's own ops (OpenBLAS): bf16, or fp32 on
  // oneDNN. Where they do, the model's own training nodes run (model/node_choice.h).
  bool leave_aten() const { return precision == Precision::bf16 || fp32 == MatmulBackend::onednn; }
  // The same library in fp32 (the router's product, which stays fp32 in bf16 training).
  Products in_fp32() const { return {Precision::fp32, fp32}; }
};

// The products of a node of ours on E operands (bf16 bits or float): such nodes run only
// where products leave ATen, so fp32 there is oneDNN's.
template <typename E>
constexpr Products node_products = {std::is_same_v<E, float> ? Precision::fp32 : Precision::bf16,
                                    MatmulBackend::onednn};

}  // namespace minimind
