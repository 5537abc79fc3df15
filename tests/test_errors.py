"""The wording of errors built from names: every valid choice, or of a long list the closest few."""

from trainsim.errors import MAX_LISTED, unknown_name


def test_a_short_list_of_choices_is_given_whole():
    error = unknown_name("device", "z80", ["k80", "a100-40gb"], field="--gpu")
    assert str(error) == "--gpu: unknown device 'z80'; valid choices: a100-40gb, k80"


def test_a_long_list_gives_the_closest_names_and_its_length():
    layers = [f"layer{i}.conv{j}" for i in range(1, 5) for j in range(1, 12)]
    assert len(layers) > MAX_LISTED
    error = unknown_name("layer", "layer2.conv13", layers)
    assert error.reason.startswith("unknown layer 'layer2.conv13'; did you mean layer2.conv3 or "
                                   "layer2.conv1 or ")
    assert error.reason.endswith(f"({len(layers)} valid choices: layer1.conv1, layer1.conv10, layer1.conv11, "
                                 "layer1.conv2, layer1.conv3, ..., layer4.conv7, layer4.conv8, layer4.conv9)")
    assert "did you mean" not in unknown_name("layer", "zzz", layers).reason
