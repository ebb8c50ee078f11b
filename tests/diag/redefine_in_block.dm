# Poor: reported again for each layer made from the block.
block scale(x) {
    param w : f32[3] = ones
    param w : f32[3] = zeros
    return x * w
}
layer a = scale
layer b = scale
