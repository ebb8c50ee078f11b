"""mlp_torch.py: examples/mlp.dm's forward in PyTorch, the oracle of the tests that run it
(test_predict.py, test_quantize.py)."""


def mlp_logits(torch, w, x):
    """logits of mlp.dm for the rows x (numpy f32 [rows, 784]) with the weights w (numpy
    arrays by parameter name, weights stored [in, out])."""
    def lin(h, name):
        return h @ torch.from_numpy(w[name + ".weight"]) + torch.from_numpy(w[name + ".bias"])
    h = (torch.from_numpy(x) - 0.2860) / 0.3530
    h = torch.relu(lin(h, "fc1"))
    h = torch.relu(lin(h, "fc2"))
    return lin(h, "fc3").numpy()
